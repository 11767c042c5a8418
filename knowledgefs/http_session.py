"""One pooled ``requests.Session`` per process for an outbound HTTP client, re-created after a fork.

A :class:`ProcessSession` builds its session on first use and shares it with every thread: so it
holds no state (cookies are never kept), ``trust_env`` is off (no proxy variable or ``.netrc``
entry changes where a request goes), and its pools are :class:`~knowledgefs.http_deadline.
GuardedAdapter` pools without urllib3 retries (callers retry themselves, under one deadline).
A forked child starts without a session: sockets and locks are never shared across a fork.
Used by the Dify transport (:mod:`knowledgefs.dify.transport`) and the Unstructured-compatible
parser client (:mod:`ingestion.unstructured.client`).
"""

from __future__ import annotations

import http.cookiejar
import os
import threading

import requests

from knowledgefs.http_deadline import GuardedAdapter


class ProcessSession:
    """The lazily built session of one client: ``pool_connections`` pools of
    ``pool_maxsize`` connections each (per host)."""

    def __init__(self, *, pool_connections: int, pool_maxsize: int) -> None:
        self.pool_connections = pool_connections
        self.pool_maxsize = pool_maxsize
        self._lock = threading.Lock()
        self._session: requests.Session | None = None
        os.register_at_fork(after_in_child=self._after_fork)

    def get(self) -> requests.Session:
        """The process's session, built once (thread-safe)."""
        session = self._session
        if session is None:
            with self._lock:
                session = self._session
                if session is None:
                    session = self._build()
                    self._session = session
        return session

    def _build(self) -> requests.Session:
        session = requests.Session()
        session.trust_env = False
        # Shared by every thread: it must hold no state, so cookies are never kept.
        session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        adapter = GuardedAdapter(
            pool_connections=self.pool_connections, pool_maxsize=self.pool_maxsize, max_retries=0
        )
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._session = None
