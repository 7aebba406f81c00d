"""Django's PostgreSQL backend with a health check that costs no round trip on an idle connection (base.py)."""
