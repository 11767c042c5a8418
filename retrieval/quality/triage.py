"""Triage, clusters, metrics and annotation of failed queries (docs/quality.md).

**Triage** (a durable job: :mod:`.triage_runs`) labels each ``pending-triage`` row with a
signal independent of the embedding that just failed: the keyword leg alone (how much of the
question's content words one chunk of the space holds) and the space's document names. It
leans to ``uncertain``:

* ``retrieval-miss``: one chunk holds at least ``MISS_COVERAGE`` of the question's words (the
  content is there, the answer did not use it) → ``pending-annotation``;
* ``coverage-gap``: no chunk holds more than ``GAP_COVERAGE`` of them, but the question shares
  words with the space (a document name, or some chunk) → ``pending-annotation``;
* ``irrelevant``: none of its words occurs in the space at all → ``dismissed``;
* ``uncertain`` otherwise, or without the question's text → ``triaged``.

When the space's profile names a reasoning model, its verdict is one more signal
(:mod:`.triage_judge`), combined leaning to ``uncertain``; its failure falls back to the rules
above (recorded in ``triage_signals.judge``).

**Annotation** (PATCH, compare-and-set on ``revision``): ``retrieval-miss`` with expected node
ids promotes the row to an active golden question (back-linked, ``promoted``); ``coverage-gap``
records a known gap (``annotated``, never a golden question); ``irrelevant`` dismisses it.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import Counter
from typing import Any

from django.db import transaction
from django.db.models import Count, F
from django.utils import timezone

from ingestion.models import Document, KnowledgeNode
from knowledgefs.errors import Conflict, InvalidInput
from retrieval import evidence as ev
from retrieval.models import GoldenQuestion
from retrieval.modes import retrieve

from . import triage_judge
from .models import FailedQuery

MISS_COVERAGE = 0.6
GAP_COVERAGE = 0.25
VERDICTS = ("retrieval-miss", "coverage-gap", "irrelevant", "uncertain")
NEXT_STATUS = {
    "retrieval-miss": "pending-annotation",
    "coverage-gap": "pending-annotation",
    "irrelevant": "dismissed",
    "uncertain": "triaged",
}
MAX_EXPECTED_IDS = 100
MAX_NOTE = 2000
_WORD = re.compile(r"\w+")


def bounded_limit(value, default: int, high: int) -> int:
    value = default if value is None else value
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InvalidInput(
            f"limit must be an integer from 1 to {high}",
            code="invalid_limit",
            details={"field": "limit", "min": 1, "max": high},
        )
    return value


def verdict_for(space, query: str, selection=None) -> tuple[str, dict]:
    """``(verdict, signals)`` of one question by the independent signals; with ``selection``
    (the space's reasoning model, :func:`.triage_judge.selection_of`) the model's verdict is
    one more signal, combined by :func:`.triage_judge.combine`."""
    words = ev.query_terms(query) if query else set()
    if not words:
        return "uncertain", {"reason": "no question text or no content words"}
    result = retrieve(space, query, mode="fast", top_k=5, score_threshold=None, legs=("keyword",))
    best = max((ev.coverage(words, item.text) for item in result.items), default=0.0)
    filenames = list(Document.objects.filter(space=space).values_list("filename", flat=True))
    names = set()
    for filename in filenames:
        names |= ev.query_terms(" ".join(_WORD.findall(filename.rsplit(".", 1)[0])))
    title_overlap = len(words & names)
    signals: dict[str, Any] = {
        "keyword_coverage": round(best, 3),
        "keyword_hits": len(result.items),
        "title_overlap": title_overlap,
    }
    verdict = _by_keywords(best, title_overlap, bool(result.items))
    if selection is None:
        return verdict, signals
    judged = triage_judge.judge(space, selection, query, filenames, [i.text for i in result.items])
    combined, rule = triage_judge.combine(verdict, judged["verdict"])
    signals.update(signals_verdict=verdict, judge=judged, combined=rule)
    return combined, signals


def _by_keywords(best: float, title_overlap: int, any_hit: bool) -> str:
    if best >= MISS_COVERAGE:
        return "retrieval-miss"
    if best <= GAP_COVERAGE and (title_overlap or best > 0):
        return "coverage-gap"
    if not any_hit and not title_overlap:
        return "irrelevant"
    return "uncertain"


def move(row: FailedQuery, verdict: str, signals: dict) -> bool:
    """Label one ``pending-triage`` row with ``verdict`` (from :func:`verdict_for`) by
    compare-and-set; False when the row had already left ``pending-triage`` (labelled by an
    earlier delivery, or annotated meanwhile): a row is never labelled twice."""
    return bool(
        FailedQuery.objects.filter(
            id=row.id, status="pending-triage", revision=row.revision
        ).update(
            status=NEXT_STATUS[verdict],
            verdict=verdict,
            triage_signals=signals,
            revision=F("revision") + 1,
            updated_at=timezone.now(),
        )  # fmt: skip
    )


def cluster_key(query: str) -> str:
    """Paraphrases share a key: the sorted content words (ASCII ones of three letters or more;
    word order, short function words and a plural ``s`` do not count)."""
    words = set()
    for word in ev.query_terms(query or ""):
        if len(word) > 2 or not word.isascii():
            words.add(word[:-1] if len(word) > 3 and word.endswith("s") else word)
    return hashlib.sha256(" ".join(sorted(words)).encode()).hexdigest()[:16] if words else ""


def clusters(rows_queryset, limit=None) -> dict:
    """``{clusters[{cluster_key, count, failed_query_ids, representative}]}``, largest first."""
    limit = bounded_limit(limit, 200, 1000)
    groups: dict[str, list] = {}
    for row in rows_queryset.exclude(query="").order_by("-created_at", "-id")[:5000]:
        groups.setdefault(cluster_key(row.query), []).append(row)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:limit]
    return {
        "clusters": [
            {"cluster_key": key, "count": len(rows),
             "failed_query_ids": [str(r.id) for r in rows[:100]],
             "representative": rows[0].query}
            for key, rows in ordered
        ]
    }  # fmt: skip


def metrics(rows_queryset) -> dict:
    by_status = dict(rows_queryset.values_list("status").annotate(n=Count("id")))
    by_trigger = dict(rows_queryset.values_list("trigger").annotate(n=Count("id")))
    total = sum(by_status.values())
    promoted = by_status.get("promoted", 0)
    return {
        "total": total,
        "promotion_rate": round(promoted / total, 4) if total else 0.0,
        "by_status": by_status,
        "by_trigger": by_trigger,
        "by_verdict": dict(
            Counter(v for v in rows_queryset.values_list("verdict", flat=True) if v)
        ),  # fmt: skip
    }


def _annotation(body) -> tuple[int, str, list, str | None]:
    if not isinstance(body, dict):
        raise InvalidInput("body must be a JSON object", code="invalid_request")
    allowed = ("expected_revision", "verdict", "expected_evidence_ids", "note")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not an annotation member",
            code="invalid_request",
            details={"field": unknown[0]},
        )
    expected = body.get("expected_revision")
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        raise InvalidInput(
            "expected_revision is required (an integer ≥ 1)",
            code="invalid_revision",
            details={"field": "expected_revision"},
        )
    verdict = body.get("verdict")
    if verdict not in ("retrieval-miss", "coverage-gap", "irrelevant"):
        raise InvalidInput(
            "verdict must be retrieval-miss, coverage-gap or irrelevant",
            code="invalid_verdict",
            details={"field": "verdict"},
        )
    ids = body.get("expected_evidence_ids", [])
    if not isinstance(ids, list) or len(ids) > MAX_EXPECTED_IDS:
        raise InvalidInput(
            f"expected_evidence_ids must list at most {MAX_EXPECTED_IDS} node ids",
            code="invalid_expected_evidence",
            details={"field": "expected_evidence_ids", "max": MAX_EXPECTED_IDS},
        )
    note = body.get("note")
    if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE):
        raise InvalidInput(
            f"note must be a string of at most {MAX_NOTE} characters",
            code="invalid_note",
            details={"field": "note", "max": MAX_NOTE},
        )
    return expected, verdict, ids, note


def annotate(row: FailedQuery, body) -> FailedQuery:
    """Annotate ``row`` (see the module docstring); 409 ``revision_conflict`` when stale."""
    expected, verdict, ids, note = _annotation(body)
    if row.status in ("promoted", "annotated", "dismissed"):
        raise Conflict(f"the failed query is already {row.status}", code="failed_query_closed")
    changes = {
        "verdict": verdict,
        "note": note or "",
        "expected_evidence_ids": [str(i) for i in ids],
    }
    evidence = []
    if verdict == "retrieval-miss":
        if not row.query:
            raise InvalidInput(
                "this failed query has no question text to promote", code="query_unknown"
            )
        evidence = _evidence(row.space, ids)
        changes["status"] = "promoted"
    else:
        changes["status"] = "annotated" if verdict == "coverage-gap" else "dismissed"
    with transaction.atomic():
        if (
            not FailedQuery.objects.filter(id=row.id, revision=expected)
            .exclude(status__in=("promoted", "annotated", "dismissed"))
            .update(**changes, revision=F("revision") + 1, updated_at=timezone.now())
        ):
            current = FailedQuery.objects.get(id=row.id)
            raise Conflict(
                f"the failed query is at revision {current.revision}, not {expected}",
                code="revision_conflict",
                details={"current_revision": current.revision, "expected_revision": expected},
            )
        if evidence:
            question = GoldenQuestion.objects.create(
                space=row.space,
                tenant_id=row.tenant_id,
                question=row.query[:4000],
                expected_evidence=evidence,
                tags=["failed-query", "retrieval-miss"],
                metadata={
                    "source": "failed-query",
                    "failed_query_id": str(row.id),
                    "trace_id": str(row.trace_id),
                },
            )
            FailedQuery.objects.filter(id=row.id).update(golden_question_id=question.id)
    row.refresh_from_db()
    return row


def _evidence(space, ids) -> list[dict]:
    if not ids:
        raise InvalidInput(
            "a retrieval miss needs expected_evidence_ids (the chunks that answer)",
            code="invalid_expected_evidence",
            details={"field": "expected_evidence_ids"},
        )
    keys = []
    for n, raw in enumerate(ids):
        try:
            keys.append(uuid.UUID(str(raw)))
        except ValueError:
            raise InvalidInput(
                f"expected_evidence_ids[{n}] is not a node id",
                code="invalid_expected_evidence",
                details={"field": f"expected_evidence_ids[{n}]"},
            ) from None
    nodes = {n.id: n for n in KnowledgeNode.objects.filter(space=space, id__in=keys)}
    missing = [str(k) for k in keys if k not in nodes]
    if missing:
        raise InvalidInput(
            f"{missing[0]} is not a chunk of this space",
            code="invalid_expected_evidence",
            details={"field": "expected_evidence_ids"},
        )
    return [
        {"document_id": str(nodes[k].document_id), "text": _snippet(nodes[k].text)}
        for k in dict.fromkeys(keys)
    ][:50]


def _snippet(text: str) -> str:
    return " ".join(text.split())[:200].strip()
