"""The benchmarks' own PostgreSQL databases: created when missing (benchmarks never use the suite's)."""

from __future__ import annotations


def ensure_database(url: str, why: str) -> None:
    """Create the database `url` names unless it exists; `why` says why SQLite will not do."""
    import dj_database_url
    import psycopg

    cfg = dj_database_url.parse(url)
    if not cfg["ENGINE"].endswith("postgresql"):
        raise SystemExit(f"this benchmark needs PostgreSQL (DATABASE_URL=postgres://...): {why}")
    admin = psycopg.connect(host=cfg["HOST"] or "127.0.0.1", port=cfg["PORT"] or 5432, user=cfg["USER"],
                            password=cfg["PASSWORD"] or None, dbname="postgres", autocommit=True)
    with admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [cfg["NAME"]]).fetchone():
            admin.execute(f'CREATE DATABASE "{cfg["NAME"]}"')
