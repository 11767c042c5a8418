"""What the vector and the text store of Dify's bridge share (inventory 7.2 and 7.3).

Ids as the routes require them (canonical UUID strings, unique), the request loop with its answer
checks, the chunked search (2048 ids per request, up to ``concurrency`` in flight, merged by
score, ties by id), the chunked delete, and upserts batched under 64 points and 32 MiB. The
stores (:mod:`.vector_store`, :mod:`.text_store`) add their scopes, points and query checks.
"""

from __future__ import annotations

import json
import math
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from . import config
from .envelope import parse_json
from .errors import DifyError
from .transport import DifyTransport


def identifier(value: Any, name: str, errors: type[DifyError]) -> str:
    """``value`` as the canonical lower-case UUID string the route requires, else ``input``."""
    try:
        return str(uuid.UUID(str(value)))
    except (ValueError, TypeError, AttributeError):
        raise errors.of("input", f"{name} must be a UUID") from None


def tenant_identifier(tenant_id: str) -> str:
    """The UUID a tenant is known by on the bridge.

    Dify's tenants are UUIDs and are sent as they are; any other tenant id (an embedded
    deployment's ``tenant-a``) is sent as its UUIDv5 in the URL namespace of
    ``knowledgefs:tenant:<id>``, so one tenant always maps to one UUID.
    """
    try:
        return str(uuid.UUID(tenant_id))
    except (ValueError, TypeError, AttributeError):
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"knowledgefs:tenant:{tenant_id}"))


_T = TypeVar("_T")


def chunks(items: Sequence[_T], size: int) -> list[Sequence[_T]]:
    """``items`` cut into consecutive pieces of at most ``size``."""
    return [items[i : i + size] for i in range(0, len(items), size)]


def _all_canonical(ids: Sequence[Any]) -> bool:
    """Whether every id is a canonical UUID string (36 characters: lower-case hex with hyphens
    at 8, 13, 18 and 23), checked by a few passes over all of them at once (no object per id)."""
    n = len(ids)
    if not n or set(map(type, ids)) != {str} or set(map(len, ids)) != {36}:
        return False
    joined = "".join(ids)
    try:
        raw = joined.encode("ascii")
    except UnicodeEncodeError:
        return False
    if raw.translate(None, b"0123456789abcdef-") or raw.count(b"-") != 4 * n:
        return False
    return all(raw[p::36] == b"-" * n for p in (8, 13, 18, 23))


def unique_ids(ids: Sequence[Any], errors: type[DifyError]) -> list[str]:
    """Canonical UUID strings of ``ids``; a repeated id is ``input`` (the route refuses it).

    Ids that are already canonical strings (what the database gives the bridge backend) are
    checked together (:func:`_all_canonical`) and kept as they are; anything else goes through
    :func:`identifier` one by one."""
    if _all_canonical(ids):
        out = list(ids)
    else:
        out = [identifier(i, "ids[]", errors) for i in ids]
    if len(set(out)) != len(out):
        raise errors.of("input", "ids must be unique")
    return out


@dataclass(frozen=True)
class Match:
    """One search hit: a point id (canonical UUID string) and its score (higher is better;
    cosine similarity for vectors, the engine's relevance for texts)."""

    id: str
    score: float


class _BridgeStore:
    """What the vector and the text client share: the transport, the request loop, the chunked
    search with its merge, and the checks of an answer.

    ``timeout_ms`` bounds each request (retries included; default 30 000, setting
    ``DIFY_VECTOR_STORE_REQUEST_TIMEOUT_MS``); ``concurrency`` is how many chunk searches of one
    search are in flight (default 4). ``requests`` counts the requests this client sent.
    """

    route: str
    errors: type[DifyError]

    def __init__(
        self,
        *,
        transport: DifyTransport | None = None,
        timeout_ms: int = config.BRIDGE_TIMEOUT_MS,
        concurrency: int = config.BRIDGE_SEARCH_CONCURRENCY,
    ) -> None:
        self.transport = transport or DifyTransport()
        self.timeout = timeout_ms / 1000
        self.concurrency = max(1, concurrency)
        self.requests = 0
        self._count_lock = threading.Lock()

    def _post(
        self, body: dict[str, Any], *, max_bytes: int = config.BRIDGE_RESPONSE_MAX_BYTES
    ) -> dict[str, Any]:
        """Send one operation, return its ``{points, matches}`` answer (both lists)."""
        with self._count_lock:  # chunk searches run on several threads
            self.requests += 1
        reply = self.transport.request(
            "POST",
            self.route,
            errors=self.errors,
            timeout=self.timeout,
            max_bytes=max_bytes,
            idempotent=True,  # every operation is: upsert by id, delete, reads
            json_body=body,
        )
        value = parse_json(reply.body, errors=self.errors, route=self.route)
        if (
            not isinstance(value, dict)
            or not isinstance(value.get("points", []), list)
            or not isinstance(value.get("matches", []), list)
        ):
            raise self.errors.of(
                "invalid", f"{self.route}: the answer is not {{points, matches}}", route=self.route
            )
        return {"points": value.get("points", []), "matches": value.get("matches", [])}

    def _check_limit(self, limit: int) -> None:
        if not isinstance(limit, int) or not 1 <= limit <= config.BRIDGE_MAX_LIMIT:
            raise self.errors.of("input", f"limit must be 1..{config.BRIDGE_MAX_LIMIT}")

    def _matches(self, answer: dict[str, Any], asked: Sequence[str], limit: int) -> list[Match]:
        """The answer's matches, refused unless each is one of ``asked``, once, with a finite
        score, and there are at most ``limit``."""
        raw = answer["matches"]
        if len(raw) > limit:
            raise self._invalid(f"{len(raw)} matches for a limit of {limit}")
        allowed = set(asked)
        seen: set[str] = set()
        out: list[Match] = []
        for item in raw:
            if not isinstance(item, dict):
                raise self._invalid("a match is not an object")
            try:
                point = str(uuid.UUID(str(item.get("id"))))
                score = float(item["score"])
            except (KeyError, ValueError, TypeError):
                raise self._invalid("a match has no UUID id or no numeric score") from None
            if point not in allowed:
                raise self._invalid("a match is not one of the authorized ids")
            if point in seen:
                raise self._invalid("a match is repeated")
            if not math.isfinite(score):
                raise self._invalid("a match has a score that is not finite")
            seen.add(point)
            out.append(Match(point, score))
        return out

    def _invalid(self, detail: str) -> DifyError:
        return self.errors.of("invalid", f"{self.route}: {detail}", route=self.route)

    def _search_chunks(
        self, ids: list[str], limit: int, body_for: Callable[[list[str]], dict[str, Any]]
    ) -> list[Match]:
        """Search every chunk of at most 2048 ``ids`` and merge: the best ``limit`` by score
        (ties by id, so the merge is deterministic)."""
        pieces = chunks(ids, config.BRIDGE_MAX_IDS)

        def one(piece: Sequence[str]) -> list[Match]:
            return self._matches(self._post(body_for(list(piece))), piece, limit)

        if len(pieces) == 1 or self.concurrency == 1:
            found = [m for piece in pieces for m in one(piece)]
        else:
            with ThreadPoolExecutor(min(self.concurrency, len(pieces))) as pool:
                found = [m for result in pool.map(one, pieces) for m in result]
        found.sort(key=lambda m: (-m.score, m.id))
        return found[:limit]

    def _search(
        self,
        scope: Any,
        ids: Sequence[Any],
        limit: int,
        query_fields: Callable[[], dict[str, Any]],
        *,
        blank: bool = False,
    ) -> list[Match]:
        """Top-``limit`` among ``ids`` (the authorized ids; none, or a ``blank`` query: no
        request, ``[]``), chunked and merged; ``query_fields()`` (checked after the ids) gives
        the query's body fields."""
        canonical = unique_ids(ids, self.errors)
        if not canonical or blank:
            return []
        body_scope = scope.as_json()
        fields = query_fields()
        return self._search_chunks(
            canonical,
            limit,
            lambda piece: {
                "operation": "search",
                "scope": body_scope,
                "ids": piece,
                **fields,
                "limit": limit,
            },
        )

    def delete(self, scope: Any, ids: Sequence[Any]) -> int:
        """Delete ``ids`` of ``scope`` (the store's scope) in requests of 2048; Dify answers
        only after it verified that they are no longer readable. Returns the requests sent."""
        body_scope = scope.as_json()
        canonical = unique_ids(ids, self.errors)
        sent = 0
        for piece in chunks(canonical, config.BRIDGE_MAX_IDS):
            self._post({"operation": "delete", "scope": body_scope, "ids": list(piece)})
            sent += 1
        return sent

    @staticmethod
    def _encoded_size(value: Any) -> int:
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _by_size(
    payload: list[dict[str, Any]], size_of: Callable[[Any], int]
) -> list[list[dict[str, Any]]]:
    """Consecutive batches of at most 64 points whose encoded size stays under the 32 MiB body
    limit (with 64 KiB left for the rest of the request)."""
    budget = config.BRIDGE_MAX_BODY_BYTES - 64 * 1024
    batches: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    used = 0
    for point in payload:
        size = size_of(point) + 1
        if current and (len(current) == config.BRIDGE_MAX_POINTS or used + size > budget):
            batches.append(current)
            current, used = [], 0
        current.append(point)
        used += size
    if current:
        batches.append(current)
    return batches
