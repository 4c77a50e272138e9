"""fedaudit coordinator service."""
