"""``kfs answer TEXT --space SLUG --tenant T [--mode M] [--json]``: a cited answer on the command
line (wired into ``knowledgefs/management/commands/kfs.py``; the work is
:mod:`retrieval.answers`)."""

from __future__ import annotations

import json

from django.core.management.base import CommandError

from knowledgefs.auth.principal import Principal
from spaces import services as spaces

from . import answers


def add_parser(sub) -> None:
    """Register ``answer`` on the ``kfs`` sub-parser set."""
    answer = sub.add_parser("answer", help="answer a question with cited evidence")
    answer.add_argument("text", metavar="TEXT")
    answer.add_argument("--space", required=True, metavar="SLUG")
    answer.add_argument("--tenant", required=True)
    answer.add_argument("--mode", choices=["fast", "deep", "research", "auto"], default=None)
    answer.add_argument("--top-k", type=int, default=None)
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
    lines = [payload["answer"], "", f"answerability: {payload['answerability']}"]
    for entry in payload["citations"]:
        c = entry["citation"]
        where = c["filename"] + (f" p.{c['page_number']}" if c["page_number"] else "")
        lines.append(f"{entry['marker']} {where} [{c['start_offset']}:{c['end_offset']}]")
    command.stdout.write("\n".join(lines))
