"""``kfs fs ls|tree|cat|grep|find|stat PATH --space S --tenant T [--json]`` and ``kfs mcp
--space S --tenant T``: the knowledge filesystem on the command line and the MCP server on
stdio for a local agent (docs/filesystem.md). Module contract of :mod:`spaces.cli`."""

from __future__ import annotations

import json

from spaces.cli import space_of

from . import mcp, shell
from .evidence import Caller

COMMANDS = ("fs", "mcp")


def add_parser(sub, name: str) -> None:
    if name == "mcp":
        serve = sub.add_parser("mcp", help="serve the MCP tools of one space on stdin/stdout")
        serve.add_argument("--space", required=True, metavar="SLUG")
        serve.add_argument("--tenant", required=True)
        return
    fs = sub.add_parser("fs", help="browse the knowledge filesystem of a space")
    fs_sub = fs.add_subparsers(dest="action", required=True)
    for action in ("ls", "tree", "cat", "grep", "find", "stat"):
        cmd = fs_sub.add_parser(action)
        if action == "grep":
            cmd.add_argument("query", metavar="TEXT")
        cmd.add_argument("path", metavar="PATH")
        cmd.add_argument("--space", required=True, metavar="SLUG")
        cmd.add_argument("--tenant", required=True)
        cmd.add_argument("--json", action="store_true")
        if action in ("ls", "tree", "grep", "find", "cat"):
            cmd.add_argument("--limit", type=int, default=None if action == "cat" else 20)
            cmd.add_argument("--cursor")
        if action == "tree":
            cmd.add_argument("--depth", type=int, default=2)
        if action == "find":
            cmd.add_argument("--name-contains")
            cmd.add_argument("--resource-type")
            cmd.add_argument("--metadata-key")
            cmd.add_argument("--metadata-value")


def handle(command, options: dict) -> None:
    space = space_of(options)
    if options["command"] == "mcp":
        mcp.serve_stdio(space)
        return
    action = options["action"]
    values = {"path": options["path"], "limit": options.get("limit")}
    for key, member in (
        ("cursor", "cursor"), ("depth", "depth"), ("query", "q"), ("name_contains", "nameContains"),
        ("resource_type", "resourceType"), ("metadata_key", "metadataKey"),
        ("metadata_value", "metadataValue"),
    ):  # fmt: skip
        if options.get(key) is not None:
            values[member] = options[key]
    result = shell.run_fs(space, action, values, Caller.operator(space))
    command.emit(options, result, _text(action, result))


def _text(action: str, result: dict) -> str:
    if action in ("ls", "find"):
        lines = [f"{'d' if i['kind'] == 'directory' else '-'} {i['path']}" for i in result["items"]]
    elif action == "tree":
        lines = [f"{'  ' * (i['depth'] - 1)}{i['name']}" for i in result["items"]]
    elif action == "grep":
        lines = [
            f"{m['path']}:{m['startOffset']}: {' '.join(m['snippet'].split())}"
            for m in result["matches"]
        ]
    elif action == "cat":
        lines = [result["text"]]
    else:
        lines = [json.dumps(result, ensure_ascii=False, indent=2)]
    if result.get("nextCursor"):
        lines.append(f"(more: --cursor {result['nextCursor']})")
    return "\n".join(lines)
