"""Server-rendered admin dashboard: HTML pages and inline SVG plots (pure string builders)."""
