"""``kfs answer TEXT --space SLUG --tenant T [--mode M] [--top-k N] [--threshold N|off]
[--filters JSON] [--json]``: a cited answer on the command line (wired into
``knowledgefs/management/commands/kfs.py``; the work is :mod:`retrieval.answers`).

:func:`threshold_value` and :func:`filters_value` also parse ``kfs query``'s ``--threshold`` and
``--filters``, so both commands read them alike."""

from __future__ import annotations

import json

from django.core.management.base import CommandError

from knowledgefs.auth.principal import Principal
from spaces import services as spaces

from . import answers
from .services import PROFILE

OFF_WORDS = ("off", "null", "none")
THRESHOLD_HELP = (
    "0..1: keep items whose final score is at least this; off (or null) turns the profile's "
    "threshold off; left out: the profile's"
)
FILTERS_HELP = (
    'a filter object, e.g. \'{"conditions": [{"name": "team", "field_type": "string", '
    '"comparison_operator": "is", "value": "hr"}]}\' (docs/retrieval.md)'
)


def threshold_value(text: str):
    """``--threshold``: ``off``/``null``/``none`` → ``None`` (no threshold), else a float (its
    range, 0..1, is checked by :func:`retrieval.services.retrieve`: ``invalid_score_threshold``).
    Raises ``argparse.ArgumentTypeError`` naming the accepted forms."""
    import argparse

    if text.strip().lower() in OFF_WORDS:
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid threshold {text!r}: a number from 0 to 1, or off/null"
        ) from None


def filters_value(raw: str | None):
    """``--filters JSON`` → the filter object (``None`` when absent); not JSON →
    :class:`CommandError` ``invalid_filter`` (the object itself is checked by ``retrieve``)."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise CommandError(f"invalid_filter: --filters is not valid JSON ({exc})") from None


def add_parser(sub) -> None:
    """Register ``answer`` on the ``kfs`` sub-parser set."""
    answer = sub.add_parser("answer", help="answer a question with cited evidence")
    answer.add_argument("text", metavar="TEXT")
    answer.add_argument("--space", required=True, metavar="SLUG")
    answer.add_argument("--tenant", required=True)
    answer.add_argument("--mode", choices=["fast", "deep", "research", "auto"], default=None)
    answer.add_argument("--top-k", type=int, default=None)
    answer.add_argument(
        "--threshold", type=threshold_value, default=PROFILE, metavar="N|off", help=THRESHOLD_HELP
    )
    answer.add_argument("--filters", metavar="JSON", help=FILTERS_HELP)
    answer.add_argument("--json", action="store_true")


def handle(command, options: dict) -> None:
    """Print ``{"answer", "answerability", "evidence": [{"marker", "text", "citation"}],
    "mode", "citations", "orphan_markers", "finish_reason", "trace_id"}`` (``--json``) or the
    answer and its sources. An ``answer.error`` is a :class:`CommandError` naming its code."""
    principal = Principal(tenant_id=spaces.validate_tenant_id(options["tenant"]))
    space = spaces.get_space_by_slug(principal, options["space"])
    run = answers.start(
        answers.Requester.of(principal),
        space,
        options["text"],
        mode=options["mode"],
        top_k=options["top_k"],
        score_threshold=options.get("threshold", PROFILE),
        filters=filters_value(options.get("filters")),
        source="cli",
    )
    name, payload = answers.answer(run)
    if name == "answer.error":
        error = payload["error"]
        raise CommandError(f"{error['code']}: {error['message']} (trace {run.trace_id})")
    result = {
        "answer": payload["answer"],
        "answerability": payload["answerability"],
        "evidence": [
            {"marker": e["marker"], "text": e["text"], "citation": e["citation"]}
            for e in payload["evidence"]
        ],
        "mode": payload["mode"],
        "citations": payload["citations"],
        "orphan_markers": payload["orphan_markers"],
        "finish_reason": payload["finish_reason"],
        "trace_id": payload["trace_id"],
    }
    if options.get("json"):
        command.stdout.write(json.dumps(result, ensure_ascii=False, indent=2))
        return
    command.stdout.write("\n".join(text_lines(payload)))


def text_lines(payload: dict) -> list[str]:
    """The human-readable answer: the answer with its markers, the state and its reasons, then
    every packed evidence item (marker, where, and the start of its text), cited ones marked
    ``*``."""
    reasons = "; ".join(payload.get("answerability_reasons") or [])
    lines = [payload["answer"], "", f"answerability: {payload['answerability']}"]
    if reasons:
        lines[-1] += f" ({reasons})"
    cited = {entry["marker"] for entry in payload["citations"]}
    if payload["evidence"]:
        lines.append("evidence:")
    for e in payload["evidence"]:
        c = e["citation"]
        where = c["filename"] + (f" p.{c['page_number']}" if c["page_number"] else "")
        snippet = " ".join(e["text"].split())
        snippet = snippet if len(snippet) <= 160 else snippet[:159] + "…"
        star = "*" if e["marker"] in cited else " "
        lines.append(
            f"{star}{e['marker']} {where} [{c['start_offset']}:{c['end_offset']}] {snippet}"
        )
    return lines
