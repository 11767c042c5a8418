"""``kfs golden import FILE.csv|FILE.jsonl --space S --tenant T [--match-policy all|any]
[--min-similarity 0.7] [--json]``: golden questions in bulk; ``kfs quality replay --space S
--tenant T (--all-active | --ids ID …) [--mode M] [--wait] [--min-pass-rate R] [--json]``: a
durable replay run, and with ``--wait`` its result, exit status 1 when the pass rate is under
``--min-pass-rate`` (a deployment gating on its own golden questions). docs/quality.md; module
contract of :mod:`spaces.cli`."""

from __future__ import annotations

import time
from pathlib import Path

from django.core.management.base import CommandError

from knowledgefs.auth.principal import Principal
from spaces.cli import space_of

from . import replay
from .evidence_match import bulk_import
from .golden_files import read_rows
from .models import ReplayRun

COMMANDS = ("golden", "quality")


def add_parser(sub, name: str) -> None:
    if name == "quality":
        parser = sub.add_parser("quality", help="replay golden questions (the quality loop)")
        actions = parser.add_subparsers(dest="action", required=True)
        run = actions.add_parser("replay", help="start a durable replay run of golden questions")
        run.add_argument("--space", required=True, metavar="SLUG")
        run.add_argument("--tenant", required=True)
        run.add_argument("--all-active", action="store_true", help="every active question")
        run.add_argument("--ids", nargs="+", metavar="ID", help="golden question ids (≤ 1000)")
        run.add_argument("--mode", choices=["fast", "deep", "research"])
        run.add_argument("--wait", action="store_true", help="wait until the run has ended")
        run.add_argument("--wait-seconds", type=int, default=3600)
        run.add_argument("--min-pass-rate", type=float, help="0..1: exit 1 below it (needs --wait)")
        run.add_argument("--json", action="store_true")
        return
    parser = sub.add_parser("golden", help="golden questions in bulk")
    actions = parser.add_subparsers(dest="action", required=True)
    imp = actions.add_parser("import", help="import golden questions from a CSV or JSONL file")
    imp.add_argument("file", metavar="FILE", help=".csv (header row) or .jsonl")
    imp.add_argument("--space", required=True, metavar="SLUG")
    imp.add_argument("--tenant", required=True)
    imp.add_argument("--match-policy", choices=["all", "any"], default="all")
    imp.add_argument("--min-similarity", type=float, default=0.7)
    imp.add_argument("--json", action="store_true")


def handle(command, options: dict) -> None:
    if options["command"] == "quality":
        _replay(command, options)
        return
    path = Path(options["file"])
    if not path.is_file():
        raise CommandError(f"{path}: no such file")
    rows = read_rows(path.name, path.read_bytes())
    result = bulk_import(
        space_of(options),
        {
            "rows": rows,
            "match_policy": options["match_policy"],
            "minimum_similarity": options["min_similarity"],
        },
    )
    command.emit(
        options,
        result,
        f"imported {len(result['items'])} golden questions: {result['active_count']} active, "
        f"{result['draft_count']} draft (evidence under the similarity threshold)",
    )


def _replay(command, options: dict) -> None:
    minimum = options["min_pass_rate"]
    if minimum is not None and (not options["wait"] or not 0 <= minimum <= 1):
        raise CommandError("--min-pass-rate takes a number from 0 to 1 and needs --wait")
    if bool(options["all_active"]) == bool(options["ids"]):
        raise CommandError("give --all-active or --ids (one of them)")
    space = space_of(options)
    body: dict = (
        {"selection": "all-active"} if options["all_active"] else
        {"golden_question_ids": options["ids"]}
    )  # fmt: skip
    if options["mode"]:
        body["mode"] = options["mode"]
    run, _ = replay.create_run(Principal(tenant_id=space.tenant_id), space, body)
    if options["wait"]:
        deadline = time.monotonic() + options["wait_seconds"]
        while run.state not in ReplayRun.TERMINAL:
            if time.monotonic() > deadline:
                raise CommandError(f"replay run {run.id} still {run.state} after --wait-seconds")
            time.sleep(0.5)
            run.refresh_from_db()
    payload = replay.as_dict(run, items=False)
    summary = run.summary or {}
    command.emit(
        options,
        payload,
        f"replay run {run.id}: {run.state}; {summary.get('passed', 0)} of "
        f"{summary.get('total', 0)} passed"
        + (f" ({run.error_code}: {run.error_message})" if run.error_code else ""),
    )
    if minimum is not None and (run.state == "canceled" or run.error_code or
                                summary.get("pass_rate", 0.0) < minimum):  # fmt: skip
        raise CommandError(
            f"pass rate {summary.get('pass_rate', 0.0)} is below --min-pass-rate {minimum}"
            if not run.error_code
            else f"the replay run failed: {run.error_code}"
        )
