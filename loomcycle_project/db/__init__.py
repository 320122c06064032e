"""Django's PostgreSQL backend with a cheap health check on pooled connections (base.py)."""
