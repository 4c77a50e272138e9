"""fedaudit coordinator service."""

__version__ = "0.1.0"
