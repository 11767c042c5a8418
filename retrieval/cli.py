"""``kfs query|research-tasks|answer|eval|reindex``: retrieval on the command line (each calls a
service; wired into ``knowledgefs/management/commands/kfs.py``). The module contract (``COMMANDS``,
``add_parser(sub, name)``, ``handle(command, options)``) is the one of :mod:`spaces.cli`.

``kfs answer TEXT --space SLUG --tenant T [--mode M] [--top-k N] [--threshold N|off]
[--filters JSON] [--json]`` is a cited answer (the work is :mod:`retrieval.answers`);
:func:`threshold_value` and :func:`filters_value` parse ``--threshold`` and ``--filters`` of both
``kfs query`` and ``kfs answer``, so both commands read them alike."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import CommandError
from tqdm import tqdm

from knowledgefs.auth.principal import Principal
from knowledgefs.pagination import add_page_arguments, cli_page
from retrieval import answers, evaluation, golden, known_item
from retrieval.calibration import DEFAULT_FUSION, FUSION_NAMES
from retrieval.modes import PROFILE, retrieve
from retrieval.recall import LEGS
from spaces import services as spaces
from spaces.cli import space_of

COMMANDS = ("query", "research-tasks", "answer", "eval", "reindex")

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
    range, 0..1, is checked by :func:`retrieval.modes.retrieve`: ``invalid_score_threshold``).
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


def add_parser(sub, name: str) -> None:
    """Register the ``kfs`` command ``name`` (one of :data:`COMMANDS`) on ``sub``."""
    _PARSERS[name](sub)


def handle(command, options: dict) -> None:
    """Run the ``kfs`` command ``options["command"]`` (one of :data:`COMMANDS`)."""
    _HANDLERS[options["command"]](command, options)


def _add_answer(sub) -> None:
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


def _add_query(sub) -> None:
    query = sub.add_parser("query", help="retrieve cited chunks")
    query.add_argument("text")
    query.add_argument("--space", required=True, metavar="SLUG")
    query.add_argument("--tenant", required=True)
    query.add_argument(
        "--mode", default=None, help="fast, deep, research or auto (default: the profile's)"
    )
    query.add_argument("--top-k", type=int, default=5)
    query.add_argument(
        "--threshold",
        type=threshold_value,
        default=PROFILE,
        metavar="N|off",
        help=THRESHOLD_HELP,
    )
    query.add_argument("--filters", metavar="JSON", help=FILTERS_HELP)
    query.add_argument("--json", action="store_true")


def _add_reindex(sub) -> None:
    reindex = sub.add_parser(
        "reindex",
        help="rebuild keyword indexes from the database (SQLite: KNOWLEDGE_VAR_DIR/search/keyword)",
    )
    which = reindex.add_mutually_exclusive_group(required=True)
    which.add_argument("--space", metavar="ID|SLUG")
    which.add_argument("--all", action="store_true", help="every space")
    reindex.add_argument("--tenant", help="the tenant of --space SLUG when two tenants use it")


def _reindex(command, options: dict) -> None:
    """Rebuild each named space's keyword index (SQLite: into a new directory swapped in;
    PostgreSQL: its impact lists and BM25 statistics in one transaction); one progress line per
    space."""
    from django.db import connection

    from retrieval.backends import backend_name, get_search_backend
    from retrieval.keyword_index import maintenance

    if connection.vendor not in ("sqlite", "postgresql") or backend_name() != "database":
        command.stdout.write(
            f"nothing to rebuild: the keyword leg of {connection.vendor} "
            f"({backend_name()} backend) is not kept by this server"
        )
        return
    spaces_ = maintenance.spaces_to_reindex(
        options.get("space"), tenant=options.get("tenant"), every=options.get("all", False)
    )
    if connection.vendor == "postgresql":
        from .backends.postgres import PostgresSearchBackend

        backend = get_search_backend()
        assert isinstance(backend, PostgresSearchBackend)  # the database backend on PostgreSQL
        for space in spaces_:
            count = backend.rebuild_keywords(space.id)
            command.stdout.write(
                f"reindex {space.tenant_id}/{space.slug} ({space.id}): {count} nodes, "
                "impact lists and statistics rebuilt"
            )
        command.stdout.write(f"{len(spaces_)} keyword index(es) rebuilt")
        return
    for space in spaces_:
        label = f"{space.tenant_id}/{space.slug} ({space.id})"

        def progress(done: int, total: int, label=label) -> None:
            command.stdout.write(f"\rreindex {label}: {done}/{total} nodes", ending="")
            command.stdout.flush()

        count = maintenance.rebuild(space.id, on_progress=progress)
        command.stdout.write(f"\rreindex {label}: {count} nodes indexed, swapped in")
    command.stdout.write(f"{len(spaces_)} keyword index(es) rebuilt")


def _add_research_tasks(sub) -> None:
    rt = sub.add_parser(
        "research-tasks", help="list a tenant's research tasks (every owner), newest first"
    )
    rt.add_argument("--tenant", required=True)
    rt.add_argument("--space", metavar="SLUG", help="only this space's tasks")
    rt.add_argument("--status", choices=["queued", "running", "completed", "failed", "canceled"])
    add_page_arguments(rt, default=50)
    rt.add_argument("--json", action="store_true")


def _add_eval(sub) -> None:
    ev = sub.add_parser(
        "eval",
        help="evaluate retrieval on a BEIR-format dataset or a space's golden questions",
    )
    ev.add_argument("dataset_dir", metavar="DATASET_DIR", nargs="?")
    ev.add_argument("--split", default="test")
    ev.add_argument("--mode", default="fast", help="a mode, or several: fast,deep,research")
    ev.add_argument("--top-k", type=int, help="items per query (BEIR: 100, golden: 10)")
    ev.add_argument("--legs", choices=["hybrid", "keyword", "dense"], default="hybrid")
    ev.add_argument("--fusion", choices=list(FUSION_NAMES), default=DEFAULT_FUSION)
    ev.add_argument("--fresh", action="store_true", help="rebuild the evaluation space")
    ev.add_argument(
        "--known-item",
        action="store_true",
        help="known-item benchmark: sentences and identifiers sampled from DATASET_DIR (a BEIR "
        "folder or a folder of documents); the document holding each must rank first",
    )
    ev.add_argument("--sample", type=int, default=300, help="known-item: targets drawn (300)")
    ev.add_argument("--golden", action="store_true", help="run --space's golden questions")
    ev.add_argument("--space", help="golden: the space's slug")
    ev.add_argument("--tenant", help="golden: the space's tenant")
    ev.add_argument("--tag", action="append", help="golden: only questions with this tag")
    ev.add_argument("--baseline", help="regression gate: compare with this baseline JSON")
    ev.add_argument(
        "--max-drop", type=float, default=None, help="gate: allowed drop (0.01; --baseline)"
    )
    ev.add_argument("--write-baseline", help="record (or extend) a baseline JSON")
    ev.add_argument("--json", action="store_true")


def _query(command, options: dict) -> None:
    space = space_of(options)
    filters = filters_value(options.get("filters"))
    result = retrieve(
        space,
        options["text"],
        top_k=options["top_k"],
        mode=options["mode"],
        score_threshold=options.get("threshold", PROFILE),
        filters=filters,
    )
    payload = result.as_dict()
    lines = []
    for n, item in enumerate(result.items, 1):
        c = item.citation
        where = c["filename"] + (f" p.{c['page_number']}" if c["page_number"] else "")
        if c["section_path"]:
            where += " › " + " › ".join(c["section_path"])
        snippet = " ".join(item.text.split())[:240]
        if item.context is not None:
            where += f"  (context: {item.context['relation']})"
        lines.append(
            f"[{n}] {item.score:.3f}  {where}  [{c['start_offset']}:{c['end_offset']}]"
            f"\n    {snippet}"
        )
    command.emit(options, payload, "\n".join(lines) or "no results")


def _research_tasks(command, options: dict) -> None:
    """``kfs research-tasks``: the tenant's tasks as an operator sees them (every owner;
    :func:`retrieval.research_tasks.service.visible_tasks`), newest first."""
    from retrieval.research_tasks import service as research_tasks

    principal = spaces.Principal(tenant_id=spaces.validate_tenant_id(options["tenant"]))
    tasks = research_tasks.visible_tasks(principal).select_related("space")
    if options["space"]:
        space = space_of(options)
        tasks = tasks.filter(space=space)
    if options["status"]:
        tasks = tasks.filter(run_state=options["status"])
    page, next_cursor = cli_page(
        tasks,
        options,
        listing="research-tasks",
        binding={
            "tenant": principal.tenant_id,
            "space": str(space.id) if options["space"] else None,
            "status": options["status"],
        },
    )
    rows = [
        {
            "id": str(t.id),
            "space": t.space.slug,
            "owner": t.owner,
            "status": t.run_state,
            "stage": t.stage,
            "query": t.query[:200],
            "attempts": t.attempt_count,
            "error_code": t.error_code or None,
            "elapsed_ms": t.elapsed_ms,
            "created_at": t.created_at.isoformat(),
        }
        for t in page
    ]
    lines = [
        f"{r['id']}  {r['status']:<9} {r['space']:<20} {r['owner']:<24} {r['query'][:60]}"
        for r in rows
    ]
    if next_cursor:
        lines.append(f"more: --cursor {next_cursor}")
    command.emit(
        options,
        {"items": rows, "next_cursor": next_cursor},
        "\n".join(lines) or "no research tasks",
    )


def _answer(command, options: dict) -> None:
    """Print the SSE ``answer.done`` payload with its field names (``--json``: ``answer``,
    ``answerability``, ``answerability_reasons``, ``evidence`` [{``marker``, ``node_id``,
    ``text``, ``citation``, ``score``, ``conflicts``}], ``citations``, ``omitted``,
    ``orphan_markers``, ``truncated``, ``generator``, ``mode``, ``finish_reason``,
    ``trace_id``, ``route``?) or the answer and its sources. An ``answer.error`` is a
    :class:`CommandError` naming its code."""
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
    result = dict(payload)  # the SSE answer.done payload, every field under its own name
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


def _eval(command, options: dict) -> None:
    """``kfs eval``: one run per ``--mode`` over a BEIR dataset or (``--golden``) a space's
    golden questions; ``--write-baseline`` records them, ``--baseline`` gates them
    (exit status 1 naming mode, metric, baseline, measured and drop when a drop exceeds
    ``--max-drop``). Baseline format: :mod:`retrieval.evaluation`, docs/retrieval.md."""
    modes = [m.strip() for m in options["mode"].split(",") if m.strip()]
    if not modes:
        raise CommandError("--mode names no mode")
    if options["max_drop"] is not None and not options["baseline"]:
        raise CommandError("--max-drop sets the regression gate's allowed drop: give --baseline")
    if options["baseline"] and "auto" in modes:
        raise CommandError(
            "--mode auto cannot be gated: it resolves to a space's default mode, which a "
            "baseline does not record; gate the concrete modes (fast, deep, research)"
        )
    baseline = evaluation.load_baseline(Path(options["baseline"])) if options["baseline"] else None
    bars: dict[str, tqdm] = {}

    def progress(phase: str, done: int, total: int) -> None:
        if options["json"]:
            return
        bar = bars.setdefault(phase, tqdm(total=total, desc=phase, unit="item"))
        bar.update(done - bar.n)

    runs = []
    for mode in modes:
        if options["golden"]:
            if not (options["space"] and options["tenant"]) or options["dataset_dir"]:
                raise CommandError("--golden needs --space and --tenant, and no DATASET_DIR")
            runs.append(
                golden.run_golden(
                    space_of(options),
                    mode=mode,
                    top_k=10 if options["top_k"] is None else options["top_k"],
                    tags=options["tag"],
                    on_progress=progress,
                )
            )
        elif options["known_item"]:
            if not options["dataset_dir"]:
                raise CommandError("--known-item needs a DATASET_DIR")
            runs.append(
                known_item.evaluate_known_item(
                    Path(options["dataset_dir"]),
                    mode=mode,
                    fusion=options["fusion"],
                    fresh=options["fresh"] and not runs,
                    sample=options["sample"],
                    on_progress=progress,
                )
            )
        else:
            if not options["dataset_dir"]:
                raise CommandError("give a DATASET_DIR, or --golden --space S --tenant T")
            runs.append(
                evaluation.evaluate(
                    Path(options["dataset_dir"]),
                    split=options["split"],
                    mode=mode,
                    legs=LEGS if options["legs"] == "hybrid" else (options["legs"],),
                    fusion=options["fusion"],
                    fresh=options["fresh"] and not runs,
                    top_k=options["top_k"] or 100,
                    on_progress=progress,
                )
            )
        for bar in bars.values():
            bar.close()
        bars.clear()
    payload: dict = runs[0] if len(runs) == 1 else {"runs": runs}
    if options["write_baseline"]:
        evaluation.write_baseline(Path(options["write_baseline"]), runs)
    gate = None
    if baseline is not None:
        max_drop = 0.01 if options["max_drop"] is None else options["max_drop"]
        gate = evaluation.check_gate(runs, baseline, max_drop)
        payload = {**payload, "gate": gate}
    command.emit(options, payload, json.dumps(payload, indent=2, ensure_ascii=False))
    if gate is not None:
        for note in gate["notes"]:
            command.stderr.write(f"note: {note}")
        if not gate["passed"]:
            raise CommandError("regression gate failed: " + "; ".join(gate["failures"]))
        command.stderr.write(f"regression gate passed ({len(gate['checks'])} checks)")


_PARSERS = {
    "query": _add_query,
    "research-tasks": _add_research_tasks,
    "answer": _add_answer,
    "eval": _add_eval,
    "reindex": _add_reindex,
}
_HANDLERS = {
    "query": _query,
    "research-tasks": _research_tasks,
    "answer": _answer,
    "eval": _eval,
    "reindex": _reindex,
}
