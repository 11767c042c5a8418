"""Full text in Dify's text store (``POST /inner/api/knowledge-fs/texts``, inventory 7.3).

The keyword projection of a knowledge space lives in the full-text index of the engine Dify's
``VECTOR_STORE`` names (Elasticsearch, Weaviate, Qdrant, TiDB). A point is a node id, its
generation id, the text as the keyword index should see it and ``content_hash``, the SHA-256 of
that text, which this client computes (Dify checks it). The scope is a tenant's knowledge space
and an ``index_version`` string naming the projection.

Limits and their handling are those of :mod:`.vector_store` (64 points per upsert and 32 MiB
per body, 2048 ids per search or delete, 64 per get, limit 1..256), plus texts of 1 MiB (UTF-8)
at most and not blank, and queries of at most 8192 characters. A search is restricted to the
authorized ids KnowledgeFS sends; answers are checked the same way. Failures are
:class:`~knowledgefs.dify.errors.TextStoreError` (``TEXT_STORE_*``).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import config
from .bridge_store import (
    Match,
    _BridgeStore,
    _by_size,
    chunks,
    identifier,
    tenant_identifier,
    unique_ids,
)
from .errors import DifyError, TextStoreError

TEXTS = "/inner/api/knowledge-fs/texts"


@dataclass(frozen=True)
class TextScope:
    """One full-text index: a tenant's knowledge space and the projection's ``index_version``
    (1..256 characters)."""

    tenant_id: str
    knowledge_space_id: str
    index_version: str

    def as_json(self) -> dict[str, Any]:
        """The ``scope`` object of a request; raises ``TEXT_STORE_INPUT_INVALID``."""
        if not 1 <= len(self.index_version) <= config.BRIDGE_MAX_SCOPE_ID_CHARS:
            raise TextStoreError.of(
                "input",
                f"scope.index_version must be 1..{config.BRIDGE_MAX_SCOPE_ID_CHARS} characters",
            )
        return {
            "tenant_id": tenant_identifier(self.tenant_id),
            "knowledge_space_id": identifier(
                self.knowledge_space_id, "scope.knowledge_space_id", TextStoreError
            ),
            "index_version": self.index_version,
        }


@dataclass(frozen=True)
class TextPoint:
    """A point: node id, generation id (UUIDs) and its text (not blank, ≤ 1 MiB UTF-8)."""

    id: str
    generation_id: str
    text: str


def content_hash(text: str) -> str:
    """The SHA-256 of the text's UTF-8 bytes, as 64 lower-case hex digits."""
    return hashlib.sha256(text.encode()).hexdigest()


class DifyTextStore(_BridgeStore):
    """Client of ``POST /inner/api/knowledge-fs/texts`` (see the module docstring)."""

    route = TEXTS
    errors: type[DifyError] = TextStoreError

    def upsert(self, scope: TextScope, points: Sequence[TextPoint]) -> int:
        """Write ``points`` (ids unique) in requests of at most 64 points and 32 MiB; returns
        the requests sent."""
        body_scope = scope.as_json()
        payload = [self._point(p) for p in points]
        if len({p["id"] for p in payload}) != len(payload):
            raise TextStoreError.of("input", "points must have unique ids")
        sent = 0
        for piece in _by_size(payload, self._encoded_size):
            self._post({"operation": "upsert", "scope": body_scope, "points": piece})
            sent += 1
        return sent

    @staticmethod
    def _point(point: TextPoint) -> dict[str, Any]:
        text = point.text
        if not isinstance(text, str) or not text.strip():
            raise TextStoreError.of("input", "points[].text must not be blank")
        if len(text.encode()) > config.BRIDGE_MAX_TEXT_BYTES:
            raise TextStoreError.of(
                "input", f"points[].text is over {config.BRIDGE_MAX_TEXT_BYTES} bytes (UTF-8)"
            )
        return {
            "id": identifier(point.id, "points[].id", TextStoreError),
            "generation_id": identifier(
                point.generation_id, "points[].generation_id", TextStoreError
            ),
            "content_hash": content_hash(text),
            "text": text,
        }

    def get(self, scope: TextScope, ids: Sequence[Any]) -> list[TextPoint]:
        """The stored points among ``ids``, 64 ids per request; a returned text whose hash is
        not its ``content_hash`` is ``TEXT_STORE_RESPONSE_INVALID``."""
        body_scope = scope.as_json()
        found: list[TextPoint] = []
        for piece in chunks(unique_ids(ids, TextStoreError), config.BRIDGE_MAX_GET_IDS):
            answer = self._post(
                {"operation": "get", "scope": body_scope, "ids": list(piece)},
                max_bytes=config.BRIDGE_GET_RESPONSE_MAX_BYTES,
            )
            asked = set(piece)
            for item in answer["points"]:
                try:
                    point = TextPoint(
                        str(uuid.UUID(str(item["id"]))),
                        str(uuid.UUID(str(item["generation_id"]))),
                        item["text"],
                    )
                    valid = isinstance(point.text, str) and item["content_hash"] == content_hash(
                        point.text
                    )
                except (KeyError, TypeError, ValueError):
                    valid = False
                if not valid:
                    raise self._invalid("get returned a malformed point or a wrong checksum")
                if point.id not in asked:
                    raise self._invalid("get returned a point that was not asked for")
                asked.discard(point.id)
                found.append(point)
        return found

    def search(self, scope: TextScope, query: str, ids: Sequence[Any], limit: int) -> list[Match]:
        """The engine's top-``limit`` for ``query`` among ``ids`` (the authorized ids; none or
        a blank query: no request, ``[]``), chunked and merged like vector searches."""
        self._check_limit(limit)
        if not isinstance(query, str) or len(query) > config.BRIDGE_MAX_QUERY_CHARS:
            raise TextStoreError.of(
                "input", f"query must be a string of at most {config.BRIDGE_MAX_QUERY_CHARS}"
            )
        return self._search(scope, ids, limit, lambda: {"query": query}, blank=not query.strip())
