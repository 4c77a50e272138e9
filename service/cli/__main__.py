"""``python -m service.cli``: the ``fedaudit`` command (the simulator starts its coordinator so)."""

import sys

from service.cli import app

sys.exit(app())
