"""The worker broker setting: django-q2 on the ORM (default) or on Redis.

Imported by ``knowledgefs/settings/`` (section "Worker broker"), so it imports nothing heavy and
raises ``ImproperlyConfigured`` with the variable, the shown value and what is accepted. A URL is
always shown without its user, password and query string.

The broker only carries messages; the state of every job lives in the database. Dispatch claims a
job in the database, commits, then publishes ``(id, delivery id)``; a worker starts only a
delivery whose id still matches the claim; the recovery sweeps re-publish a claim whose message
never arrived. That is what makes a broker without acknowledgements (Redis) safe: a message lost
with a killed cluster, or flushed from Redis, is re-published after the dispatch grace
(``KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS``, ``KNOWLEDGE_UPGRADE_DISPATCH_GRACE_SECONDS``,
``KNOWLEDGE_RESEARCH_TASK_DISPATCH_GRACE_SECONDS``).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

BROKERS = ("orm", "redis")
REDIS_SCHEMES = ("redis", "rediss", "unix")
#: Seconds to open a connection to Redis before ``async_task`` fails (and the claim is released
#: for the sweep): an unreachable Redis must not hold an upload request for the TCP timeout.
CONNECT_TIMEOUT_S = 5
#: Seconds one Redis command may take; above django-q2's 1 s ``BLPOP`` wait of an idle worker.
SOCKET_TIMEOUT_S = 15


def shown_url(raw: str) -> str:
    """``raw`` without user, password and query string, for error messages and logs."""
    return re.sub(r"^([A-Za-z0-9+.-]*://)?[^@/]*@", r"\1***@", raw.strip()).split("?", 1)[0]


def parse_queue_broker(raw: str) -> str:
    """``KNOWLEDGE_QUEUE_BROKER`` → ``"orm"`` or ``"redis"`` (case and blanks ignored; empty →
    ``"orm"``). Raises ``ImproperlyConfigured`` naming the accepted values otherwise."""
    value = (raw or "").strip().lower() or "orm"
    if value not in BROKERS:
        raise ImproperlyConfigured(
            f"KNOWLEDGE_QUEUE_BROKER={raw.strip()!r} is not one of: {', '.join(BROKERS)}"
        )
    return value


def parse_queue_redis_url(broker: str, *, queue_url: str, shared_url: str) -> str:
    """The Redis URL django-q2 connects to, or ``""`` on the ORM broker.

    ``queue_url`` is ``KNOWLEDGE_QUEUE_REDIS_URL``, ``shared_url`` is ``REDIS_URL`` (its default).
    Under ``redis`` one of them must be a ``redis://``, ``rediss://`` or ``unix://`` URL; the
    result carries ``socket_connect_timeout`` (:data:`CONNECT_TIMEOUT_S`) and
    ``socket_timeout`` (:data:`SOCKET_TIMEOUT_S`) unless the URL sets them. Under ``orm`` a set
    ``KNOWLEDGE_QUEUE_REDIS_URL`` is refused (it would be silently unused); ``REDIS_URL`` alone
    is fine there (it also holds the shared cache). Raises ``ImproperlyConfigured``.
    """
    queue_url, shared_url = (queue_url or "").strip(), (shared_url or "").strip()
    if broker != "redis":
        if queue_url:
            raise ImproperlyConfigured(
                "KNOWLEDGE_QUEUE_REDIS_URL is set but KNOWLEDGE_QUEUE_BROKER is orm: set "
                "KNOWLEDGE_QUEUE_BROKER=redis to use it, or unset it"
            )
        return ""
    name, url = ("KNOWLEDGE_QUEUE_REDIS_URL", queue_url) if queue_url else ("REDIS_URL", shared_url)
    if not url:
        raise ImproperlyConfigured(
            "KNOWLEDGE_QUEUE_BROKER=redis needs KNOWLEDGE_QUEUE_REDIS_URL (or REDIS_URL), "
            "e.g. redis://redis:6379/1"
        )
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in 0..65535
    except ValueError:
        raise ImproperlyConfigured(f"{name}={shown_url(url)!r} has an invalid port") from None
    if parts.scheme not in REDIS_SCHEMES or not (parts.hostname or parts.path):
        raise ImproperlyConfigured(
            f"{name}={shown_url(url)!r} is not a Redis URL: redis://host:port/db, "
            "rediss://host:port/db or unix:///path/to/redis.sock is required"
        )
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query.setdefault("socket_connect_timeout", str(CONNECT_TIMEOUT_S))
    query.setdefault("socket_timeout", str(SOCKET_TIMEOUT_S))
    return urlunsplit(parts._replace(query=urlencode(query)))
