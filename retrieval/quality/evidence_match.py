"""Evidence matching for golden questions: which chunks of a space hold a given evidence text,
by the space's own dense index, and golden questions imported in bulk.

``match_texts`` embeds every text in one batch with the model of the space's active index
version and takes the ``top_k`` nearest visible chunks of each by cosine; a text is *matched*
when its best candidate scores at least ``minimum_similarity`` (default 0.7).
``match_nodes`` resolves node ids of the space directly (score 1.0). Limits: 1–500 texts of at
most 8,000 characters, or 1–50 node ids; ``top_k`` 1–10 (default 5). A space without a dense
index answers 503 ``evidence_matching_unavailable``.

``bulk_import`` matches all rows' evidence in one batch and creates one golden question per
row in one transaction: ``active`` (expected evidence: the best chunk's document and the
opening of its text) when the best candidate reaches the threshold, else ``draft`` (the
evidence text kept as the expected snippet, to be reviewed).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import transaction

from knowledgefs.db import lock_for_update
from knowledgefs.errors import Conflict, InvalidInput, Unavailable
from retrieval import golden
from retrieval.backends import get_search_backend
from retrieval.models import GoldenQuestion
from retrieval.recall import embed_queries, load_nodes, resolve_snapshot
from spaces.models import KnowledgeSpace

MAX_TEXTS = 500
MAX_TEXT_CHARS = 8000
MAX_NODE_IDS = 50
MAX_ROWS = 500
DEFAULT_SIMILARITY = 0.7
DEFAULT_TOP_K = 5
SNIPPET_CHARS = 200  # the expected snippet of an active imported question: a chunk's opening
MATCH_MEMBERS = ("evidence_texts", "node_ids", "minimum_similarity", "top_k")
IMPORT_MEMBERS = ("rows", "match_policy", "minimum_similarity")
ROW_MEMBERS = ("question", "evidence", "tags", "metadata")
MATCH_POLICIES = ("all", "any")


def _members(body, allowed: tuple[str, ...], what: str) -> dict:
    if not isinstance(body, dict):
        raise InvalidInput(f"{what} must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not a member of {what} (members: {', '.join(allowed)})",
            code="invalid_request",
            details={"field": unknown[0]},
        )
    return body


def similarity_of(body: dict) -> float:
    value = body.get("minimum_similarity", DEFAULT_SIMILARITY)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise InvalidInput(
            "minimum_similarity must be a number from 0 to 1 (default 0.7)",
            code="invalid_minimum_similarity",
            details={"field": "minimum_similarity", "min": 0, "max": 1},
        )
    return float(value)


def _top_k(body: dict) -> int:
    value = body.get("top_k", DEFAULT_TOP_K)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10:
        raise InvalidInput(
            "top_k must be an integer from 1 to 10 (default 5)",
            code="invalid_top_k",
            details={"field": "top_k", "min": 1, "max": 10},
        )
    return value


def _texts(value, field: str, limit: int) -> list[str]:
    if not isinstance(value, list) or not 1 <= len(value) <= limit:
        count = len(value) if isinstance(value, list) else "no"
        raise InvalidInput(
            f"{field} must be a list of 1 to {limit} texts ({count} given)",
            code="too_many_items" if isinstance(value, list) and len(value) > limit else
            "invalid_evidence_texts",
            details={"field": field, "max": limit},
        )  # fmt: skip
    for n, text in enumerate(value):
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_TEXT_CHARS:
            raise InvalidInput(
                f"{field}[{n}] must be a text of 1 to {MAX_TEXT_CHARS} characters",
                code="invalid_evidence_texts",
                details={"field": f"{field}[{n}]", "max": MAX_TEXT_CHARS},
            )
    return value


def _candidate(node, score: float) -> dict:
    return {
        "document_id": str(node.document_id),
        "node_id": str(node.id),
        "score": round(float(score), 4),
        "section_path": list(node.section_path or []),
        "page_number": node.page_number,
        "filename": node.filename,
        "text": node.text,
    }


def match_texts(space: KnowledgeSpace, texts: list[str], *, top_k: int, minimum: float):
    """``[{evidence_text, matched, candidates[...]}]`` per text, in order (one embedding batch)."""
    snapshot = resolve_snapshot(space)
    if snapshot.version is None:
        raise Unavailable(
            "evidence matching needs the space's dense index, and this space has none yet",
            code="evidence_matching_unavailable",
        )
    number, model_id, dimension = snapshot.version
    vectors = embed_queries(space, snapshot, list(texts))
    backend = get_search_backend()
    hits = [
        backend.dense_search(
            space.id, vector, index_version=number, head_revision=snapshot.head_revision,
            limit=top_k, dimension=dimension, model_id=model_id,
        )
        for vector in vectors
    ]  # fmt: skip
    nodes = load_nodes(sorted({h.node_id for found in hits for h in found}, key=str))
    items = []
    for text, found in zip(texts, hits, strict=True):
        candidates = [_candidate(nodes[h.node_id], h.score) for h in found if h.node_id in nodes]
        matched = bool(candidates) and candidates[0]["score"] >= minimum
        items.append({"evidence_text": text, "matched": matched, "candidates": candidates})
    return items


def match_nodes(space: KnowledgeSpace, node_ids) -> dict:
    """Node ids of the space as evidence: ``{items, resolved_evidence}``; an id that is not a
    visible chunk of this space is ``matched: false``."""
    if not isinstance(node_ids, list) or not 1 <= len(node_ids) <= MAX_NODE_IDS:
        too_many = isinstance(node_ids, list) and len(node_ids) > MAX_NODE_IDS
        raise InvalidInput(
            f"node_ids must be a list of 1 to {MAX_NODE_IDS} node ids"
            + (f" ({len(node_ids)} given)" if isinstance(node_ids, list) else ""),
            code="too_many_items" if too_many else "invalid_node_ids",
            details={"field": "node_ids", "max": MAX_NODE_IDS},
        )
    idents = []
    for n, raw in enumerate(node_ids):
        try:
            idents.append(uuid.UUID(str(raw)))
        except ValueError:
            raise InvalidInput(
                f"node_ids[{n}] is not a node id (a UUID)",
                code="invalid_node_ids",
                details={"field": f"node_ids[{n}]"},
            ) from None
    from ingestion.models import KnowledgeNode

    own = set(KnowledgeNode.objects.filter(id__in=idents, space=space).values_list("id", flat=True))
    nodes = load_nodes([i for i in idents if i in own])
    items, resolved = [], []
    for raw, ident in zip(node_ids, idents, strict=True):
        node = nodes.get(ident)
        candidates = [_candidate(node, 1.0)] if node else []
        items.append({"node_id": str(raw), "matched": bool(node), "candidates": candidates})
        if node:
            resolved.append({"document_id": str(node.document_id), "node_id": str(node.id)})
    return {"items": items, "resolved_evidence": resolved}


def evidence_matches(space: KnowledgeSpace, body) -> dict:
    """``POST …/golden-questions/evidence-matches``: exactly one of ``evidence_texts`` or
    ``node_ids``, ``minimum_similarity``, ``top_k``."""
    body = _members(body, MATCH_MEMBERS, "the evidence-match body")
    if ("evidence_texts" in body) == ("node_ids" in body):
        raise InvalidInput(
            "give exactly one of evidence_texts or node_ids",
            code="invalid_request",
            details={"field": "evidence_texts"},
        )
    minimum, top_k = similarity_of(body), _top_k(body)
    if "node_ids" in body:
        return match_nodes(space, body["node_ids"])
    texts = _texts(body["evidence_texts"], "evidence_texts", MAX_TEXTS)
    return {"items": match_texts(space, texts, top_k=top_k, minimum=minimum)}


def _row(n: int, row) -> dict:
    row = _members(row, ROW_MEMBERS, f"rows[{n}]")
    try:
        question = golden.validate_question(row.get("question"))
        tags = golden.validate_tags(row.get("tags"))
        metadata = golden.validate_metadata(row.get("metadata"))
    except InvalidInput as exc:
        raise InvalidInput(
            f"rows[{n}]: {exc.message}", code=exc.code, details={"row_index": n}
        ) from None
    evidence = row.get("evidence")
    if not isinstance(evidence, str) or not evidence.strip() or len(evidence) > MAX_TEXT_CHARS:
        raise InvalidInput(
            f"rows[{n}].evidence must be a text of 1 to {MAX_TEXT_CHARS} characters",
            code="invalid_evidence_texts",
            details={"row_index": n, "field": "evidence"},
        )
    return {"question": question, "evidence": evidence.strip(), "tags": tags, "metadata": metadata}


def bulk_import(space: KnowledgeSpace, body) -> dict:
    """``POST …/golden-questions/bulk-import`` ``{rows[1..500], match_policy?,
    minimum_similarity?}`` → ``{active_count, draft_count, items[{row_index, question_id, status,
    expected_evidence_id?, similarity?}]}``; nothing is created unless every row is valid."""
    body = _members(body, IMPORT_MEMBERS, "the bulk-import body")
    rows = body.get("rows")
    if not isinstance(rows, list) or not 1 <= len(rows) <= MAX_ROWS:
        count = len(rows) if isinstance(rows, list) else "no"
        raise InvalidInput(
            f"rows must be a list of 1 to {MAX_ROWS} rows in one batch ({count} given)",
            code="too_many_items" if isinstance(rows, list) and rows else "invalid_rows",
            details={"field": "rows", "max": MAX_ROWS},
        )
    policy = body.get("match_policy", "all")
    if policy not in MATCH_POLICIES:
        raise InvalidInput(
            "match_policy must be all or any",
            code="invalid_match_policy",
            details={"field": "match_policy"},
        )
    minimum = similarity_of(body)
    checked = [_row(n, row) for n, row in enumerate(rows)]
    matches = match_texts(space, [r["evidence"] for r in checked], top_k=1, minimum=minimum)
    limit = settings.KNOWLEDGE_GOLDEN_MAX_QUESTIONS_PER_SPACE
    items, active = [], 0
    with transaction.atomic():
        lock_for_update(KnowledgeSpace.objects.all()).filter(id=space.id).first()
        held = GoldenQuestion.objects.filter(space=space).count()
        if held + len(checked) > limit:
            raise Conflict(
                f"this space holds {held} golden questions; {len(checked)} more would pass the "
                f"limit of {limit} (KNOWLEDGE_GOLDEN_MAX_QUESTIONS_PER_SPACE)",
                code="golden_question_limit",
            )
        for n, (row, match) in enumerate(zip(checked, matches, strict=True)):
            best = match["candidates"][0] if match["candidates"] else None
            item: dict = {"row_index": n}
            if match["matched"]:
                assert best is not None  # matched: the best candidate passed the minimum
                snippet = " ".join(best["text"].split())[:SNIPPET_CHARS].strip()
                expected = [{"document_id": best["document_id"], "text": snippet}]
                status = "active"
                item |= {"expected_evidence_id": best["node_id"], "similarity": best["score"]}
                active += 1
            else:
                expected = [{"text": row["evidence"][: golden.MAX_SNIPPET_CHARS]}]
                status = "draft"
                if best:
                    item["similarity"] = best["score"]
            metadata = row["metadata"] | {
                "import": {"similarity": best["score"] if best else None,
                           "minimum_similarity": minimum}
            }  # fmt: skip
            question = GoldenQuestion.objects.create(
                space=space, tenant_id=space.tenant_id, question=row["question"],
                expected_evidence=expected, tags=row["tags"], metadata=metadata,
                status=status, match_policy=policy,
            )  # fmt: skip
            items.append(item | {"question_id": str(question.id), "status": status})
    return {"active_count": active, "draft_count": len(items) - active, "items": items}
