"""fedaudit client SDK."""
