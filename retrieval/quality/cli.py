"""``kfs golden import FILE.csv|FILE.jsonl --space S --tenant T [--match-policy all|any]
[--min-similarity 0.7] [--json]``: golden questions in bulk (docs/quality.md). Module contract
of :mod:`spaces.cli`."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import CommandError

from spaces.cli import space_of

from .evidence_match import bulk_import
from .golden_files import read_rows

COMMANDS = ("golden",)


def add_parser(sub, name: str) -> None:
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
