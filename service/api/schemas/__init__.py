"""Wire models of the HTTP API, one module per resource (never the ORM classes)."""
