"""Golden questions: CRUD with validation, and a run that scores a retrieval mode against them.

A golden question names the evidence a good retrieval must return (``expected_evidence``, see
:class:`retrieval.models.GoldenQuestion`). An expected evidence item is *found* at rank ``r``
when the ``r``-th returned item (1-based) satisfies every constraint the item gives: its
citation's ``document_id`` equals ``document_id``, its ``node_id`` equals ``node_id``, and its
text contains ``text`` after both are case-folded and their whitespace collapsed. Document ids
survive recompilation, snippets survive re-chunking as long as the snippet stays within one
chunk (keep snippets short: a sentence); node ids do not survive either.

Run metrics over the questions (:func:`run_golden`), all means over questions:

- ``hit_rate@k``: share of questions with at least one expected item found in the top ``k``;
- ``recall@k``: share of a question's expected items found in the top ``k``;
- ``mrr@k``: ``1 / rank`` of the first returned item that matches any expected item (0 if none);
- ``passed``: questions whose every expected item was found (``pass`` per question).

Limits (reference inventory §2.13): question 1..4000 characters, at most 20 tags of at most 80
characters each; ours: 1..50 evidence items, a snippet of at most 2000 characters, metadata at
most 64 KiB of JSON, ``KNOWLEDGE_GOLDEN_MAX_QUESTIONS_PER_SPACE`` questions per space.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ingestion.models import Document
from knowledgefs.db import lock_for_update
from knowledgefs.errors import Conflict, InvalidInput
from spaces.models import KnowledgeSpace
from spaces.services import Principal, get_space

from .models import GoldenQuestion

MAX_QUESTION_CHARS = 4000  # reference inventory §2.13
MAX_TAGS = 20  # reference inventory §3.5 (tags ≤ 20)
MAX_TAG_CHARS = 80  # reference inventory §2.13
MAX_EVIDENCE_ITEMS = 50
MAX_SNIPPET_CHARS = 2000
MAX_METADATA_BYTES = 64 * 1024
EVIDENCE_KEYS = ("document_id", "node_id", "text")
FIELDS = ("question", "expected_evidence", "tags", "metadata", "status", "match_policy")
STATUSES = ("active", "draft")  # only active questions are run (evaluation, replay)
MATCH_POLICIES = ("all", "any")


# --- validation ---------------------------------------------------------------------------------
def validate_question(value) -> str:
    """The question, stripped; 400 ``invalid_question`` unless a string of 1..4000 characters."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput("question must be a non-empty string", code="invalid_question")
    value = value.strip()
    if len(value) > MAX_QUESTION_CHARS:
        raise InvalidInput(
            f"question is {len(value)} characters; the limit is {MAX_QUESTION_CHARS}",
            code="invalid_question",
        )
    return value


def validate_tags(value) -> list[str]:
    """Stripped, de-duplicated tags (order kept); 400 ``invalid_tags`` for more than 20 distinct
    tags (duplicates are dropped first), an empty one, or one over 80 characters."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput("tags must be a list of strings", code="invalid_tags")
    tags: list[str] = []
    for n, tag in enumerate(value):
        if not isinstance(tag, str) or not tag.strip():
            raise InvalidInput(f"tags[{n}] must be a non-empty string", code="invalid_tags")
        tag = tag.strip()
        if len(tag) > MAX_TAG_CHARS:
            raise InvalidInput(
                f"tags[{n}] is {len(tag)} characters; the limit is {MAX_TAG_CHARS}",
                code="invalid_tags",
            )
        if tag not in tags:
            tags.append(tag)
    if len(tags) > MAX_TAGS:  # counted after de-duplication: 21 copies of one tag are one tag
        raise InvalidInput(
            f"tags has {len(tags)} distinct entries; the limit is {MAX_TAGS}", code="invalid_tags"
        )
    return tags


def _choice(name: str, choices: tuple[str, ...], default: str):
    def check(value) -> str:
        value = default if value is None else value
        if value not in choices:
            raise InvalidInput(
                f"{name} must be one of: {', '.join(choices)}", code=f"invalid_{name}"
            )
        return value

    return check


validate_status = _choice("status", STATUSES, "active")
validate_match_policy = _choice("match_policy", MATCH_POLICIES, "all")


def validate_metadata(value) -> dict:
    """400 ``invalid_metadata`` unless a JSON object of at most 64 KiB."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput("metadata must be a JSON object", code="invalid_metadata")
    size = len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    if size > MAX_METADATA_BYTES:
        raise InvalidInput(
            f"metadata is {size} bytes of JSON; the limit is {MAX_METADATA_BYTES}",
            code="invalid_metadata",
        )
    return value


def validate_evidence(space: KnowledgeSpace, value) -> list[dict]:
    """Normalised evidence items (ids in canonical form, snippets stripped).

    400 ``invalid_expected_evidence`` naming the item: not a list of 1..50 objects; an item
    without any of ``document_id``, ``node_id``, ``text``, or with another key; an id that is
    not a UUID; a ``document_id`` that is not a document of this space; an empty snippet or one
    over 2000 characters.
    """
    code = "invalid_expected_evidence"
    if not isinstance(value, list) or not value:
        raise InvalidInput("expected_evidence must be a non-empty list of objects", code=code)
    if len(value) > MAX_EVIDENCE_ITEMS:
        raise InvalidInput(
            f"expected_evidence has {len(value)} items; the limit is {MAX_EVIDENCE_ITEMS}",
            code=code,
        )
    items = []
    for n, raw in enumerate(value):
        where = f"expected_evidence[{n}]"
        if not isinstance(raw, dict) or not any(raw.get(k) is not None for k in EVIDENCE_KEYS):
            raise InvalidInput(
                f"{where} must be an object with document_id, node_id and/or text", code=code
            )
        unknown = sorted(set(raw) - set(EVIDENCE_KEYS))
        if unknown:
            raise InvalidInput(f"{where} has unknown keys: {', '.join(unknown)}", code=code)
        item: dict = {}
        for key in ("document_id", "node_id"):
            if raw.get(key) is not None:
                try:
                    item[key] = str(uuid.UUID(str(raw[key])))
                except ValueError:
                    raise InvalidInput(f"{where}.{key} must be a UUID", code=code) from None
        if raw.get("text") is not None:
            text = raw["text"]
            if not isinstance(text, str) or not text.strip():
                raise InvalidInput(f"{where}.text must be a non-empty string", code=code)
            if len(text.strip()) > MAX_SNIPPET_CHARS:
                raise InvalidInput(
                    f"{where}.text is {len(text.strip())} characters; the limit is "
                    f"{MAX_SNIPPET_CHARS}",
                    code=code,
                )
            item["text"] = text.strip()
        items.append(item)
    wanted = {i["document_id"] for i in items if "document_id" in i}
    known = {
        str(d)
        for d in Document.objects.filter(space=space, id__in=wanted).values_list("id", flat=True)
    }
    for n, item in enumerate(items):
        if "document_id" in item and item["document_id"] not in known:
            raise InvalidInput(
                f"expected_evidence[{n}].document_id {item['document_id']} is not a document "
                "of this space",
                code=code,
            )
    return items


# --- CRUD ---------------------------------------------------------------------------------------
def questions_in(space: KnowledgeSpace):
    """The space's golden questions (a queryset, newest first)."""
    return GoldenQuestion.objects.filter(space=space).order_by("-created_at", "-id")


def create_question(space: KnowledgeSpace, body) -> GoldenQuestion:
    """Create a golden question from ``{"question", "expected_evidence", "tags"?, "metadata"?}``.

    Each member is checked by its ``validate_*`` (400; unknown members refused); a space holds
    at most ``KNOWLEDGE_GOLDEN_MAX_QUESTIONS_PER_SPACE`` questions (409).
    """
    body = _object(body, allowed=FIELDS)
    values = {
        "question": validate_question(body.get("question")),
        "expected_evidence": validate_evidence(space, body.get("expected_evidence")),
        "tags": validate_tags(body.get("tags")),
        "metadata": validate_metadata(body.get("metadata")),
        "status": validate_status(body.get("status")),
        "match_policy": validate_match_policy(body.get("match_policy")),
    }
    limit = settings.KNOWLEDGE_GOLDEN_MAX_QUESTIONS_PER_SPACE
    with transaction.atomic():
        lock_for_update(KnowledgeSpace.objects.all()).filter(id=space.id).first()
        if GoldenQuestion.objects.filter(space=space).count() >= limit:
            raise Conflict(
                f"this space already holds {limit} golden questions, the limit "
                "(KNOWLEDGE_GOLDEN_MAX_QUESTIONS_PER_SPACE)",
                code="golden_question_limit",
            )
        return GoldenQuestion.objects.create(space=space, tenant_id=space.tenant_id, **values)


def get_question(principal: Principal, space_id, question_id) -> GoldenQuestion:
    """The question if the principal reaches its space; 404 ``space_not_found`` or
    ``golden_question_not_found`` (also for another space's or tenant's question)."""
    space = get_space(principal, space_id)
    return GoldenQuestion.objects.get_in_space(space, question_id, what="golden question")


def update_question(
    question: GoldenQuestion, body, *, expected_revision: int | None = None
) -> GoldenQuestion:
    """Replace the members ``body`` names (any of ``question``, ``expected_evidence``, ``tags``,
    ``metadata``); ``revision`` moves on by one.

    With ``expected_revision`` (``If-Match`` or the body's ``revision``) the update applies only
    while the stored revision matches (compare-and-set); a revision is a positive integer.
    Members are checked as for :func:`create_question`.
    """
    body = _object(body, allowed=(*FIELDS, "revision"))
    if expected_revision is None:
        expected_revision = body.get("revision")
    if expected_revision is not None and (
        isinstance(expected_revision, bool)
        or not isinstance(expected_revision, int)
        or expected_revision < 1
    ):
        raise InvalidInput("revision must be a positive integer", code="invalid_revision")
    validators = {
        "question": validate_question,
        "expected_evidence": lambda v: validate_evidence(question.space, v),
        "tags": validate_tags,
        "metadata": validate_metadata,
        "status": validate_status,
        "match_policy": validate_match_policy,
    }
    changes = {k: validators[k](body[k]) for k in FIELDS if k in body}
    target = GoldenQuestion.objects.filter(id=question.id)
    if expected_revision is not None:
        target = target.filter(revision=expected_revision)
    # QuerySet.update bypasses auto_now: updated_at is set here.
    updated = (
        target.update(revision=F("revision") + 1, updated_at=timezone.now(), **changes)
        if changes
        else target.count()
    )
    if not updated:
        current = GoldenQuestion.objects.filter(id=question.id).values_list("revision", flat=True)
        raise Conflict(
            f"the golden question is at revision {current.first()}, not {expected_revision}; "
            "read it again",
            code="revision_conflict",
        )
    question.refresh_from_db()
    return question


def delete_question(question: GoldenQuestion) -> None:
    """Delete the question (idempotent at the row level)."""
    GoldenQuestion.objects.filter(id=question.id).delete()


def as_dict(question: GoldenQuestion) -> dict:
    """The API shape of a question."""
    return {
        "id": str(question.id),
        "space_id": str(question.space_id),
        "question": question.question,
        "expected_evidence": question.expected_evidence,
        "tags": question.tags,
        "metadata": question.metadata,
        "status": question.status,
        "match_policy": question.match_policy,
        "revision": question.revision,
        "created_at": question.created_at.isoformat().replace("+00:00", "Z"),
        "updated_at": question.updated_at.isoformat().replace("+00:00", "Z"),
    }


def _object(body, *, allowed: tuple[str, ...]) -> dict:
    if not isinstance(body, dict):
        raise InvalidInput("the body must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidInput(
            f"unknown members: {', '.join(unknown)} (accepted: {', '.join(allowed)})",
            code="invalid_request",
        )
    return body


# --- the run ------------------------------------------------------------------------------------
_SPACE_RE = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _SPACE_RE.sub(" ", text).strip().casefold()


def matches(evidence: dict, item) -> bool:
    """Whether a returned :class:`retrieval.recall.RetrievalItem` satisfies every constraint
    of one expected evidence item."""
    if "document_id" in evidence and item.citation["document_id"] != evidence["document_id"]:
        return False
    if "node_id" in evidence and str(item.node_id) != evidence["node_id"]:
        return False
    return "text" not in evidence or _norm(evidence["text"]) in _norm(item.text)


@dataclass
class QuestionOutcome:
    """One question's result: ``found`` maps evidence index → rank (1-based)."""

    question: GoldenQuestion
    found: dict[int, int]
    first_rank: int | None
    returned: int
    latency_ms: float

    def as_dict(self) -> dict:
        evidence = self.question.expected_evidence
        return {
            "id": str(self.question.id),
            "question": self.question.question,
            "tags": self.question.tags,
            "pass": len(self.found) == len(evidence),
            "first_hit_rank": self.first_rank,
            "found": [{**evidence[i], "rank": r} for i, r in sorted(self.found.items())],
            "missed": [e for i, e in enumerate(evidence) if i not in self.found],
            "returned": self.returned,
            "latency_ms": round(self.latency_ms, 2),
        }


def score_question(question: GoldenQuestion, items: list, latency_ms: float) -> QuestionOutcome:
    """Match the returned ``items`` (ranked) against the question's expected evidence."""
    found: dict[int, int] = {}
    first_rank = None
    for rank, item in enumerate(items, 1):
        for n, evidence in enumerate(question.expected_evidence):
            if matches(evidence, item):
                found.setdefault(n, rank)
                first_rank = first_rank or rank
    return QuestionOutcome(question, found, first_rank, len(items), latency_ms)


def question_set(questions: list[GoldenQuestion]) -> dict:
    """``{"count", "digest"}`` of the questions a run measured: SHA-256 over the sorted
    ``id:revision`` pairs, so a question added, deleted or edited since a baseline (or another
    ``--tag`` selection) is a different subject for the regression gate."""
    pairs = sorted(f"{q.id}:{q.revision}" for q in questions)
    return {"count": len(pairs), "digest": hashlib.sha256("\n".join(pairs).encode()).hexdigest()}


def run_golden(
    space: KnowledgeSpace,
    *,
    mode: str = "fast",
    top_k: int = 10,
    tags: list[str] | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Run every golden question of the space (those carrying all ``tags``, when given) through
    :func:`retrieval.modes.retrieve` with ``mode`` and ``top_k`` (threshold off).

    Returns ``{"kind": "golden", "tenant", "space", "mode", "top_k", "tags", "question_set"
    (:func:`question_set`), "questions", "passed",
    "hit_rate@k", "recall@k", "mrr@k", "query_p50_ms", "query_p95_ms", "results": [...]}``
    (metric names carry the real ``k``, e.g. ``hit_rate@10``). ``top_k`` 1..100. A selection of
    no question is refused (400): an empty run must not pass a gate. Errors of ``retrieve``
    propagate.
    """
    from .evaluation import percentile
    from .modes import retrieve

    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= 100:
        raise InvalidInput(f"top_k must be an integer from 1 to 100, not {top_k!r}",
                           code="invalid_top_k")  # fmt: skip
    selected = list(questions_in(space).filter(status="active").order_by("created_at", "id"))
    if tags:
        selected = [q for q in selected if set(tags) <= set(q.tags)]
    if not selected:
        raise InvalidInput(
            f"space {space.slug!r} has no golden questions"
            + (f" tagged {', '.join(tags)}" if tags else ""),
            code="no_golden_questions",
        )
    outcomes = []
    for n, question in enumerate(selected, 1):
        t0 = time.perf_counter()
        result = retrieve(space, question.question, top_k=top_k, mode=mode, score_threshold=None)
        outcomes.append(score_question(question, result.items, (time.perf_counter() - t0) * 1000))
        if on_progress:
            on_progress("question", n, len(selected))
    latencies = sorted(o.latency_ms for o in outcomes)
    return {
        "kind": "golden",
        "tenant": space.tenant_id,
        "space": space.slug,
        "mode": mode,
        "top_k": top_k,
        "tags": sorted(set(tags or ())),
        "question_set": question_set(selected),
        "questions": len(outcomes),
        "passed": sum(len(o.found) == len(o.question.expected_evidence) for o in outcomes),
        f"hit_rate@{top_k}": round(statistics.fmean(bool(o.found) for o in outcomes), 4),
        f"recall@{top_k}": round(
            statistics.fmean(len(o.found) / len(o.question.expected_evidence) for o in outcomes),
            4,
        ),
        f"mrr@{top_k}": round(
            statistics.fmean(1 / o.first_rank if o.first_rank else 0.0 for o in outcomes), 4
        ),
        "query_p50_ms": round(percentile(latencies, 50), 2),
        "query_p95_ms": round(percentile(latencies, 95), 2),
        "embedding_model": space.embedding_model_id,
        "results": [o.as_dict() for o in outcomes],
    }
