"""What the test servers on loopback (knowledgefs/testing/dify_server.py,
knowledgefs/testing/unstructured_server.py) share: stopping like a dead process and their base
URL."""

from __future__ import annotations

import socket
import threading
from http.server import ThreadingHTTPServer


class LoopbackServerMixin:
    """Needs ``stopping`` (threading.Event), ``lock``, ``_connections`` (open sockets),
    ``_httpd`` (the ThreadingHTTPServer or ``None``) and ``_thread`` (its serving thread)."""

    # Set by the subclass's __init__ (declared here, not assigned).
    stopping: threading.Event
    lock: threading.Lock
    _connections: set[socket.socket]
    _httpd: ThreadingHTTPServer | None
    _thread: threading.Thread | None

    def stop(self) -> None:
        """Stop listening, release hung handlers and cut every open connection, as a dead
        process would (a kept-alive connection would otherwise go on being served)."""
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        with self.lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        """``http://host:port`` of the listening socket."""
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        assert isinstance(host, str)  # an AF_INET(6) server's host (the stub also allows bytes)
        return f"http://{host}:{port}"
