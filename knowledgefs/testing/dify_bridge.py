"""The vector and text bridge of the simulated Dify, in memory (:class:`BridgeStore`)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from .dify_contract import _WORD


class BridgeRefusal(Exception):
    """A bridge request refused: ``status`` (400 invalid, 413 quota, 503 missing collection)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


#: Builds the 400 refusal naming what the contract refuses (raised by the caller).
_Refuse = Callable[[str], BridgeRefusal]
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_HASH = re.compile(r"^[0-9a-f]{64}$")


class BridgeStore:
    """Dify's knowledge-fs vectors and texts routes in memory, per the contract (inventory
    7.2-7.3): a collection per scope, created on the first upsert; ≤ 64 points per upsert and
    per get, ≤ 2048 ids, limit 1..256, dimension 1..16384, UUID ids, unique ids, vectors of the
    scope's dimension, finite and non-zero, texts checked against their SHA-256, queries
    ≤ 8192 characters; anything else is 400. Search: cosine (vectors) or BM25 over the whole
    collection (texts: :meth:`_text_search`), only among the ids sent; a search of a missing
    collection is 503. Delete removes, then checks the ids are gone.

    Switches: ``unavailable`` (every request 503 with ``Retry-After: retry_after``),
    ``quota_points`` (an upsert that would take a tenant's vector points past it is 413
    ``vector_space_quota_exceeded``). :meth:`points` and :meth:`collections` show the state.
    """

    MAX_BODY_BYTES = 32 * 1024 * 1024
    KINDS = ("dense", "visual", "graph-entity", "graph-relation")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.vectors: dict[str, dict[str, dict[str, Any]]] = {}  # collection → id → point
        self.texts: dict[str, dict[str, dict[str, Any]]] = {}
        self.scopes: dict[str, dict[str, Any]] = {}  # collection → its scope
        self.unavailable = False
        self.retry_after = 1
        self.quota_points: int | None = None

    # -- observations --------------------------------------------------------------------------

    def collections(self, *, texts: bool = False) -> dict[str, dict[str, Any]]:
        """Collection name → scope, for the vector (or text) collections that exist."""
        with self.lock:
            names = self.texts if texts else self.vectors
            return {name: self.scopes[name] for name in names}

    def points(
        self, *, texts: bool = False, space_id: str | None = None
    ) -> dict[str, dict[str, Any]]:
        """Every stored point by id (of one knowledge space when ``space_id``)."""
        with self.lock:
            store = self.texts if texts else self.vectors
            return {
                pid: dict(point)
                for name, points in store.items()
                if space_id is None or self.scopes[name]["knowledge_space_id"] == space_id
                for pid, point in points.items()
            }

    # -- requests ------------------------------------------------------------------------------

    def execute(self, body: Any, *, texts: bool) -> dict[str, Any]:
        request = self._validate(body, texts=texts)
        name = self._collection(request["scope"], texts)
        with self.lock:
            store = self.texts if texts else self.vectors
            operation = request["operation"]
            if operation == "upsert":
                if not texts:
                    self._admit(request)
                self.scopes[name] = request["scope"]
                collection = store.setdefault(name, {})
                for point in request["points"]:
                    collection[point["id"].lower()] = dict(point, id=point["id"].lower())
                return {"points": [], "matches": []}
            existing = store.get(name)
            ids = [i.lower() for i in request["ids"]]
            if operation == "search":
                if existing is None:
                    raise BridgeRefusal(503, "unavailable", "existing is missing")
                matches = self._text_search if texts else self._vector_search
                return {"points": [], "matches": matches(existing, request, ids)}
            if existing is None:
                return {"points": [], "matches": []}
            if operation == "get":
                return {"points": [existing[i] for i in ids if i in existing], "matches": []}
            for i in ids:
                existing.pop(i, None)
            if any(i in existing for i in ids):  # delete verifies invisibility
                raise BridgeRefusal(503, "unavailable", "deletion not yet visible")
            return {"points": [], "matches": []}

    def _admit(self, request: dict[str, Any]) -> None:
        if self.quota_points is None:
            return
        tenant = request["scope"]["tenant_id"]
        held = {
            (name, pid)
            for name, points in self.vectors.items()
            if self.scopes[name]["tenant_id"] == tenant
            for pid in points
        }
        name = self._collection(request["scope"], False)
        new = {(name, p["id"].lower()) for p in request["points"]} - held
        if len(held) + len(new) > self.quota_points:
            raise BridgeRefusal(413, "vector_space_quota_exceeded", "vector-space quota exceeded")

    @staticmethod
    def _collection(scope: dict[str, Any], texts: bool) -> str:
        identity = json.dumps(scope, sort_keys=True, separators=(",", ":"))
        prefix = "knowledgefs_v1_fts_" if texts else "knowledgefs_v1_"
        return prefix + hashlib.sha256(identity.encode()).hexdigest()[:32]

    # -- validation (400 for anything the contract refuses) ------------------------------------

    def _validate(self, body: Any, *, texts: bool) -> dict[str, Any]:
        def refuse(message: str) -> BridgeRefusal:
            return BridgeRefusal(400, "invalid_request", message)

        allowed = {"operation", "scope", "points", "ids", "limit"}
        allowed |= {"query"} if texts else {"query_vector"}
        if not isinstance(body, dict) or set(body) - allowed:
            raise refuse("unknown field")
        operation = body.get("operation")
        if operation not in ("upsert", "get", "search", "delete"):
            raise refuse("operation")
        scope = self._scope(body.get("scope"), texts, refuse)
        points, ids = body.get("points", []), body.get("ids", [])
        limit = body.get("limit", 10)
        if not isinstance(points, list) or len(points) > 64:
            raise refuse("points: at most 64")
        if not isinstance(ids, list) or len(ids) > 2048:
            raise refuse("ids: at most 2048")
        if not isinstance(limit, int) or not 1 <= limit <= 256:
            raise refuse("limit: 1..256")
        if operation == "upsert":
            if not points or ids or body.get("query") or body.get("query_vector"):
                raise refuse("upsert takes points only")
            for point in points:
                self._point(point, scope, texts, refuse)
            if len({p["id"].lower() for p in points}) != len(points):
                raise refuse("duplicate point ids")
        else:
            if not ids or points or len({str(i).lower() for i in ids}) != len(ids):
                raise refuse("a bounded set of unique ids is required")
            if not all(isinstance(i, str) and _UUID.match(i) for i in ids):
                raise refuse("ids must be UUIDs")
            if operation == "get" and len(ids) > 64:
                raise refuse("get: at most 64 ids")
            if operation == "search" and texts:
                query = body.get("query", "")
                if not isinstance(query, str) or not query.strip() or len(query) > 8192:
                    raise refuse("query: 1..8192 characters")
            elif operation == "search":
                self._vector(body.get("query_vector"), scope["dimension"], refuse)
            elif body.get("query") or body.get("query_vector"):
                raise refuse("get and delete take ids only")
        return {**body, "scope": scope, "points": points, "ids": ids, "limit": limit}

    def _scope(self, scope: Any, texts: bool, refuse: _Refuse) -> dict[str, Any]:
        keys = {"tenant_id", "knowledge_space_id"}
        keys |= {"index_version"} if texts else {"vector_space_id", "kind", "dimension"}
        if not isinstance(scope, dict) or set(scope) != keys:
            raise refuse("scope fields")
        for key in ("tenant_id", "knowledge_space_id"):
            if not isinstance(scope[key], str) or not _UUID.match(scope[key]):
                raise refuse(f"scope.{key} must be a UUID")
        name = "index_version" if texts else "vector_space_id"
        if not isinstance(scope[name], str) or not 1 <= len(scope[name]) <= 256:
            raise refuse(f"scope.{name}: 1..256 characters")
        if not texts:
            if scope["kind"] not in self.KINDS:
                raise refuse("scope.kind")
            dimension = scope["dimension"]
            if isinstance(dimension, bool) or not isinstance(dimension, int):
                raise refuse("scope.dimension")
            if not 1 <= dimension <= 16384:
                raise refuse("scope.dimension: 1..16384")
        return {k: (v.lower() if k.endswith("_id") and k != "vector_space_id" else v)
                for k, v in scope.items()}  # fmt: skip

    def _point(self, point: Any, scope: dict[str, Any], texts: bool, refuse: _Refuse) -> None:
        keys = {"id", "generation_id", "content_hash", "text" if texts else "vector"}
        if not isinstance(point, dict) or set(point) != keys:
            raise refuse("point fields")
        if not all(isinstance(point[k], str) and _UUID.match(point[k])
                   for k in ("id", "generation_id")):  # fmt: skip
            raise refuse("point ids must be UUIDs")
        if not isinstance(point["content_hash"], str) or not _HASH.match(point["content_hash"]):
            raise refuse("content_hash")
        if texts:
            text = point["text"]
            if not isinstance(text, str) or not text.strip() or len(text.encode()) > 1 << 20:
                raise refuse("text: not blank, at most 1 MiB")
            if hashlib.sha256(text.encode()).hexdigest() != point["content_hash"]:
                raise refuse("full-text checksum mismatch")
        else:
            self._vector(point["vector"], scope["dimension"], refuse)

    @staticmethod
    def _vector(vector: Any, dimension: int, refuse: _Refuse) -> None:
        if not isinstance(vector, list) or len(vector) != dimension:
            raise refuse("vector dimension")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in vector):
            raise refuse("vector values")
        if not all(math.isfinite(v) for v in vector) or not any(vector):
            raise refuse("vector must be finite and non-zero")
        if max(abs(v) for v in vector) > 1e10:
            raise refuse("vector magnitude")

    # -- search --------------------------------------------------------------------------------

    @staticmethod
    def _vector_search(
        collection: dict[str, Any], request: dict[str, Any], ids: list[str]
    ) -> list[dict[str, Any]]:
        query = request["query_vector"]
        query_norm = math.sqrt(sum(v * v for v in query))
        scored = []
        for pid in ids:
            point = collection.get(pid)
            if point is None:
                continue
            vector = point["vector"]
            norm = math.sqrt(sum(v * v for v in vector))
            score = sum(a * b for a, b in zip(query, vector, strict=True)) / (norm * query_norm)
            scored.append({"id": pid, "score": score})
        scored.sort(key=lambda m: -m["score"])
        return scored[: request["limit"]]

    @staticmethod
    def _text_search(
        collection: dict[str, Any], request: dict[str, Any], ids: list[str]
    ) -> list[dict[str, Any]]:
        """BM25 as Elasticsearch ranks English text (k1 1.2, b 0.75, stemmed words), computed by
        an in-memory SQLite FTS5 table (Porter stemming) over the whole collection, so two
        requests on one collection have comparable scores; the words of the query are OR-ed."""
        words = list(dict.fromkeys(_WORD.findall(request["query"].lower())))
        if not words:
            return []
        match = "text : (" + " OR ".join('"' + w.replace('"', '""') + '"' for w in words) + ")"
        db = sqlite3.connect(":memory:")
        try:
            db.execute(
                "CREATE VIRTUAL TABLE t USING fts5(text, id UNINDEXED, "
                "tokenize = 'porter unicode61 remove_diacritics 2')"
            )
            db.executemany(
                "INSERT INTO t (text, id) VALUES (?, ?)",
                [(p["text"], pid) for pid, p in collection.items()],
            )
            db.execute("CREATE TEMP TABLE allowed (id TEXT PRIMARY KEY)")
            db.executemany("INSERT OR IGNORE INTO allowed VALUES (?)", [(i,) for i in ids])
            rows = db.execute(
                "SELECT id, rank FROM t WHERE t MATCH ? AND id IN (SELECT id FROM allowed) "
                "ORDER BY rank LIMIT ?",
                (match, request["limit"]),
            ).fetchall()
        finally:
            db.close()
        return [{"id": pid, "score": -float(rank)} for pid, rank in rows]
