"""The coordinator's worker threads run BLAS on one thread (service/audit/_blas.py).

With the OpenBLAS that numpy and scipy ship, a limit set from a worker thread does not take once
the main thread has set one, so the app sets the process-wide limit when it is built. Run in a
fresh interpreter: the limit is process-wide and other tests build apps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import json, sys, tempfile, threading
from pathlib import Path
import scipy.linalg  # both OpenBLAS libraries loaded, as in the coordinator
from threadpoolctl import ThreadpoolController, threadpool_info
from pydantic import SecretStr

def blas():
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

# the main thread sets a limit and restores it (what a pass on the main thread does) ...
ThreadpoolController().limit(limits=2, user_api="blas").restore_original_limits()
before = blas()
from service.config import Settings
from service.main import create_app
with tempfile.TemporaryDirectory() as tmp:
    settings = Settings(_env_file=None, data_dir=Path(tmp), admin_token=SecretStr("x" * 24),
                        check_migrations=False)
    create_app(settings, run_reaper=False)
seen = {}
thread = threading.Thread(target=lambda: seen.update(worker=blas()))
thread.start()
thread.join()
print(json.dumps({"before": before, "worker": seen["worker"]}))
"""


def test_a_worker_thread_of_the_coordinator_runs_blas_on_one_thread() -> None:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=root, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["before"] or max(result["before"]) < 2:
        pytest.skip(f"BLAS runs on one thread here already ({result['before']})")
    assert result["worker"]
    assert set(result["worker"]) == {1}
