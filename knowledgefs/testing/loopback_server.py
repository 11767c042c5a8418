"""What the test servers on loopback (knowledgefs/testing/dify_server.py,
knowledgefs/testing/unstructured_server.py) share: stopping like a dead process and their base
URL."""

from __future__ import annotations

import socket


class LoopbackServerMixin:
    """Needs ``stopping`` (threading.Event), ``lock``, ``_connections`` (open sockets),
    ``_httpd`` (the ThreadingHTTPServer or ``None``) and ``_thread`` (its serving thread)."""

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
        return f"http://{host}:{port}"
