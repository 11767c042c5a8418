"""The safe shell: a parser (``shlex``) and a dispatcher over the filesystem commands, never a
host shell.

A command is at most :data:`MAX_STEPS` steps joined by ``|``: the first a filesystem command
(``ls tree cat stat grep find diff``), the others in-memory transforms (``head tail wc jq``,
``jq`` taking a path selector only, such as ``.items[0].path``). The output is JSON, except the
lines ``head``/``tail`` cut from a text (``cat``). ``;``, ``&``, ``<``, ``>``,
backticks, ``$(``, parentheses, an empty step and an unterminated quote are refused with 400
naming the token. The output is at most :data:`MAX_OUTPUT_BYTES` bytes, then ``truncated``.
"""

from __future__ import annotations

import json
import re
import shlex

from knowledgefs.errors import InvalidInput

from . import grep as grep_mod
from . import listing, reading

MAX_COMMAND_CHARS = 4_000
MAX_STEPS = 5
MAX_OUTPUT_BYTES = 128 * 1024
DEFAULT_LIST_LIMIT = 20
FS_COMMANDS = ("ls", "tree", "cat", "stat", "grep", "find", "diff")
TRANSFORMS = ("head", "tail", "wc", "jq")
# flag -> (input member, is integer)
FLAGS = {
    "--limit": ("limit", True),
    "--depth": ("depth", True),
    "--name-contains": ("nameContains", False),
    "--resource-type": ("resourceType", False),
    "--metadata-key": ("metadataKey", False),
    "--metadata-value": ("metadataValue", False),
    "--mode": ("mode", False),
    "--cursor": ("cursor", False),
    "--timeout-ms": ("timeoutMs", True),
}
ALLOWED_FLAGS = {
    "ls": ("--limit", "--cursor"),
    "tree": ("--limit", "--depth", "--cursor"),
    "find": (
        "--limit", "--cursor", "--name-contains", "--resource-type", "--metadata-key",
        "--metadata-value",
    ),
    "grep": ("--limit", "--cursor", "--timeout-ms"),
    "cat": ("--limit", "--cursor"),
    "stat": (),
    "diff": ("--mode",),
}  # fmt: skip
POSITIONAL = {
    "ls": ("path",),
    "tree": ("path",),
    "find": ("path",),
    "cat": ("path",),
    "stat": ("path",),
    "grep": ("q", "path"),
    "diff": ("oldPath", "newPath"),
}
_SELECTOR = re.compile(r'\.(?:[A-Za-z_][A-Za-z0-9_]*)|\[(?:\d+|-\d+|"[^"]*")\]')


def refuse(message: str, code: str, token: str | None = None) -> InvalidInput:
    return InvalidInput(message, code=code, details={"field": "command", "token": token})


def plan(command) -> dict:
    """``{command, steps[{argv, command, kind, input}]}`` or 400 naming what is refused."""
    if command is not None and not isinstance(command, str):
        raise InvalidInput(
            "command must be a string (a shell command line)",
            code="invalid_command",
            details={"field": "command"},
        )
    if not isinstance(command, str) or not command.strip():
        raise refuse("command is required", "invalid_command")
    if len(command) > MAX_COMMAND_CHARS:
        raise InvalidInput(
            f"command is {len(command)} characters; at most {MAX_COMMAND_CHARS} are allowed",
            code="command_too_long",
            details={"field": "command", "limit": MAX_COMMAND_CHARS},
        )
    for token in ("`", "$("):
        if token in command:
            raise refuse(
                f"{token!r} is not allowed (no substitution)", "shell_syntax_refused", token
            )
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        raise refuse("the command has an unterminated quote", "shell_unterminated_quote") from None
    steps: list[list[str]] = [[]]
    for token in tokens:
        if token == "|":
            steps.append([])
        elif token and set(token) <= set("();<>|&"):
            raise refuse(
                f"{token!r} is not allowed (only | joins steps; no lists, redirections or "
                "background jobs)",
                "shell_syntax_refused",
                token,
            )
        else:
            steps[-1].append(token)
    if any(not s for s in steps):
        raise refuse("the command has an empty step", "shell_empty_step", "|")
    if len(steps) > MAX_STEPS:
        raise refuse(f"at most {MAX_STEPS} steps are allowed", "shell_too_many_steps")
    planned = []
    for index, argv in enumerate(steps):
        name = argv[0]
        if index == 0 and name not in FS_COMMANDS:
            raise refuse(
                f"{name!r} is not a filesystem command; the first step is one of: "
                f"{', '.join(FS_COMMANDS)}",
                "shell_command_not_allowed",
                name,
            )
        if index > 0 and name not in TRANSFORMS:
            raise refuse(
                f"{name!r} is not allowed after the first step; use one of: "
                f"{', '.join(TRANSFORMS)}",
                "shell_command_not_allowed",
                name,
            )
        parse = _fs_input if index == 0 else _transform_input
        planned.append(
            {
                "argv": argv,
                "command": name,
                "kind": "filesystem" if index == 0 else "transform",
                "input": parse(name, argv[1:]),
            }
        )
    return {"command": command, "steps": planned}


def _fs_input(name: str, args: list[str]) -> dict:
    values: dict = {}
    positional: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            if arg not in ALLOWED_FLAGS[name]:
                raise refuse(f"{name} does not take {arg}", "shell_invalid_argument", arg)
            if i + 1 >= len(args):
                raise refuse(f"{arg} needs a value", "shell_invalid_argument", arg)
            member, integer = FLAGS[arg]
            given = args[i + 1]
            if integer:
                if not re.fullmatch(r"[0-9]{1,9}", given):
                    raise refuse(f"{arg} needs an integer", "shell_invalid_argument", given)
                values[member] = int(given)
            else:
                values[member] = given
            i += 2
        else:
            positional.append(arg)
            i += 1
    wanted = POSITIONAL[name]
    if len(positional) != len(wanted):
        raise refuse(
            f"{name} takes {len(wanted)} argument(s): {' '.join(wanted)}",
            "shell_invalid_argument",
            positional[len(wanted)] if len(positional) > len(wanted) else None,
        )
    values.update(zip(wanted, positional, strict=True))
    if name in ("ls", "tree", "find", "grep"):
        values.setdefault("limit", DEFAULT_LIST_LIMIT)
    return values


def _transform_input(name: str, args: list[str]) -> dict:
    if name in ("head", "tail"):
        if not args:
            return {"lines": 10}
        if len(args) == 2 and args[0] in ("-n", "--lines") and re.fullmatch(r"[0-9]{1,9}", args[1]):
            return {"lines": int(args[1])}
        raise refuse(f"{name} takes -n N or --lines N", "shell_invalid_argument", args[0])
    if name == "wc":
        if args:
            raise refuse("wc takes no arguments", "shell_invalid_argument", args[0])
        return {}
    if len(args) != 1 or not _is_selector(args[0]):
        raise refuse(
            "jq takes one path selector such as .items[0].path",
            "shell_invalid_argument",
            args[0] if args else None,
        )
    return {"selector": args[0]}


def _is_selector(text: str) -> bool:
    if text == ".":
        return True
    return bool(text.startswith(".") and "".join(_SELECTOR.findall(text)) == text)


def run_fs(space, name: str, values: dict, caller=None) -> dict:
    """One filesystem command with its input members (as the HTTP routes and MCP tools take);
    ``caller`` (:class:`.evidence.Caller`) decides what ``/evidence`` shows."""
    v = values.get
    if name == "ls":
        return listing.ls(space, v("path"), v("limit"), v("cursor"), caller)
    if name == "tree":
        return listing.tree_listing(space, v("path"), v("limit"), v("depth"), v("cursor"), caller)
    if name == "find":
        return listing.find(
            space, v("path"), v("limit"), v("cursor"), name_contains=v("nameContains"),
            metadata_key=v("metadataKey"), metadata_value=v("metadataValue"),
            resource_type=v("resourceType"), caller=caller,
        )  # fmt: skip
    if name == "grep":
        return grep_mod.grep(space, v("q"), v("path"), v("limit"), v("cursor"), v("timeoutMs"))
    if name == "cat":
        return reading.cat(space, v("path"), v("limit"), v("cursor"), caller)
    if name == "stat":
        return reading.stat(space, v("path"), caller)
    if name == "diff":
        return reading.diff(space, v("oldPath"), v("newPath"), v("mode"))
    raise refuse(f"{name!r} is not a filesystem command", "shell_command_not_allowed", name)


def execute(space, command, caller=None) -> dict:
    """Plan, run the first step, apply the transforms; ``{output, plan, truncated}``."""
    planned = plan(command)
    first = planned["steps"][0]
    value = run_fs(space, first["command"], first["input"], caller)
    for step in planned["steps"][1:]:
        value = _transform(step["command"], step["input"], value)
    raw = isinstance(value, str) and planned["steps"][-1]["command"] in ("head", "tail")
    text = (
        value if raw and isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)
    )
    data = text.encode()
    truncated = len(data) > MAX_OUTPUT_BYTES
    if truncated:
        text = data[:MAX_OUTPUT_BYTES].decode(errors="ignore")
    return {"output": text, "plan": planned, "truncated": truncated}


def _as_text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return value["text"]
    return json.dumps(value, ensure_ascii=False, indent=1)


def _transform(name: str, args: dict, value):
    if name in ("head", "tail"):
        n = args["lines"]
        if isinstance(value, dict):
            for member in ("items", "matches", "operations"):
                if isinstance(value.get(member), list):
                    rows = value[member]
                    return {**value, member: rows[:n] if name == "head" else rows[-n:] if n else []}
        lines = _as_text(value).splitlines(keepends=True)
        return "".join(lines[:n] if name == "head" else (lines[-n:] if n else []))
    if name == "wc":
        text = _as_text(value)
        return {
            "bytes": len(text.encode()),
            "lines": len(text.splitlines()),
            "words": len(text.split()),
        }
    return select(value, args["selector"])


def select(value, selector: str):
    """A ``jq`` path selector applied to ``value``; a missing member is ``None``."""
    if selector == ".":
        return value
    for part in _SELECTOR.findall(selector):
        if part.startswith("."):
            value = value.get(part[1:]) if isinstance(value, dict) else None
        elif part.startswith('["'):
            value = value.get(part[2:-2]) if isinstance(value, dict) else None
        else:
            index = int(part[1:-1])
            value = (
                value[index]
                if isinstance(value, list) and -len(value) <= index < len(value)
                else None
            )
        if value is None:
            return None
    return value
