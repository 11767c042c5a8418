"""Run a command against a throw-away MariaDB server (Debian's ``mariadb-server``).

Usage: ``python scripts/with_mariadb.py [--skip-if-missing] COMMAND [ARGS...]``.

Initialises a fresh data folder ``var/mariadb-test-*`` (``mariadb-install-db``), starts
``mariadbd`` on 127.0.0.1 on a free port with that folder and its own socket in a short
``/tmp/kfs-mdb-*`` folder (a socket path has at most 107 bytes; never a system server or its
configuration: ``--no-defaults``), creates the database ``kfs`` and a user with a
random password, exports ``DATABASE_URL=mysql://…``, runs the command, stops the server, removes
the folder and exits with the command's status.

Without ``mariadbd`` on PATH (``make mariadb`` installs it): exit 1 with a message, or, with
``--skip-if-missing`` and unless ``KFS_REQUIRE_MARIADB=1`` (CI), print why and exit 0.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Seconds to wait for the server to accept connections, and for it to stop after SIGTERM.
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def as_root_args() -> list[str]:
    """mariadbd refuses to run as root unless told to; as another user it runs as that user."""
    return ["--user=root"] if os.geteuid() == 0 else []


def initialise(datadir: Path) -> None:
    """Create the system tables in ``datadir``; root logs in with an (empty) password over the
    socket, not through unix_socket authentication, so the harness needs no OS account."""
    command = [
        shutil.which("mariadb-install-db") or "mariadb-install-db",
        "--no-defaults",
        f"--datadir={datadir}",
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
        *as_root_args(),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise SystemExit(f"mariadb-install-db failed ({run.returncode}):\n{run.stderr[-2000:]}")


def start(datadir: Path, socket_path: Path, port: int) -> subprocess.Popen:
    """Start mariadbd on 127.0.0.1:``port``; its log goes to ``datadir/error.log``."""
    command = [
        shutil.which("mariadbd") or "mariadbd",
        "--no-defaults",
        f"--datadir={datadir}",
        f"--socket={socket_path}",
        f"--pid-file={datadir / 'mysqld.pid'}",
        f"--log-error={datadir / 'error.log'}",
        "--bind-address=127.0.0.1",
        f"--port={port}",
        "--skip-name-resolve",
        "--skip-log-bin",
        "--innodb-buffer-pool-size=64M",
        "--innodb-log-file-size=16M",
        "--character-set-server=utf8mb4",
        "--collation-server=utf8mb4_unicode_ci",
        *as_root_args(),
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_ready(server: subprocess.Popen, datadir: Path, socket_path: Path):
    """Connect as root over the socket once the server accepts; raises SystemExit if it died."""
    import pymysql

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if server.poll() is not None:
            log = (datadir / "error.log").read_text(errors="replace")[-2000:]
            raise SystemExit(f"mariadbd exited with {server.returncode}:\n{log}")
        try:
            return pymysql.connect(unix_socket=str(socket_path), user="root")
        except pymysql.err.OperationalError as exc:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"mariadbd did not accept connections in {START_TIMEOUT_S} s: {exc}"
                ) from None
            time.sleep(0.2)


def create_database(connection, password: str) -> None:
    """Database ``kfs`` (utf8mb4) and user ``kfs``@127.0.0.1 with every privilege (the test
    runner creates and drops ``test_kfs``)."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE DATABASE kfs CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
        cursor.execute("CREATE USER 'kfs'@'127.0.0.1' IDENTIFIED BY %s", (password,))
        cursor.execute("GRANT ALL PRIVILEGES ON *.* TO 'kfs'@'127.0.0.1'")
    connection.commit()
    connection.close()


def stop(server: subprocess.Popen) -> None:
    """SIGTERM (a clean shutdown), then SIGKILL after :data:`STOP_TIMEOUT_S`."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main(argv: list[str]) -> int:
    skip_if_missing = bool(argv) and argv[0] == "--skip-if-missing"
    argv = argv[1:] if skip_if_missing else argv
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    if not (shutil.which("mariadbd") and shutil.which("mariadb-install-db")):
        message = "MariaDB is not installed (mariadbd not on PATH; run `make mariadb`)"
        if skip_if_missing and os.environ.get("KFS_REQUIRE_MARIADB") != "1":
            print(f"{message}: skipping the MariaDB run: {' '.join(argv)}", flush=True)
            return 0
        print(f"{message}; KFS_REQUIRE_MARIADB=1 makes this a failure", file=sys.stderr)
        return 1
    root = Path(__file__).resolve().parent.parent
    (root / "var").mkdir(parents=True, exist_ok=True)
    datadir = Path(tempfile.mkdtemp(prefix="mariadb-test-", dir=root / "var"))
    socket_dir = Path(tempfile.mkdtemp(prefix="kfs-mdb-", dir="/tmp"))
    socket_path = socket_dir / "mysqld.sock"
    server = None
    try:
        initialise(datadir)
        port = free_port()
        server = start(datadir, socket_path, port)
        password = secrets.token_urlsafe(18)
        create_database(wait_ready(server, datadir, socket_path), password)
        url = f"mysql://kfs:{password}@127.0.0.1:{port}/kfs"
        print(f"MariaDB ready: mysql://kfs:***@127.0.0.1:{port}/kfs", flush=True)
        return subprocess.call(argv, env=dict(os.environ, DATABASE_URL=url))
    finally:
        if server is not None:
            stop(server)
        shutil.rmtree(datadir, ignore_errors=True)
        shutil.rmtree(socket_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
