"""Virtual paths: validation and the names of published documents and their parts.

A path is ``/`` + a root (``knowledge``, ``sources``, ``evidence``, ``workspaces``) + segments,
at most :data:`MAX_PATH_CHARS` characters, each segment non-empty without slash or whitespace;
``.`` and ``..`` segments, ``//`` and NUL are refused (400 ``invalid_path``), never resolved.
"""

from __future__ import annotations

import hashlib
import re

from knowledgefs.errors import InvalidInput

MAX_PATH_CHARS = 384
ROOTS = ("knowledge", "sources", "evidence", "workspaces")
#: The longest part of a document's folder name built from its filename.
MAX_SLUG_CHARS = 96
#: The longest section file stem built from its heading path.
MAX_SECTION_CHARS = 160

_SEPARATORS = re.compile(r"[/\\\s]+")


def check_path(path, field: str = "path") -> list[str]:
    """The segments of ``path`` after the leading slash, or 400 ``invalid_path`` naming the rule
    it breaks (``path_too_long`` over 384 characters)."""
    if not isinstance(path, str) or not path:
        raise InvalidInput(f"{field} is required", code="invalid_path", details={"field": field})
    if len(path) > MAX_PATH_CHARS:
        raise InvalidInput(
            f"{field} is {len(path)} characters; at most {MAX_PATH_CHARS} are allowed",
            code="path_too_long",
            details={"field": field, "limit": MAX_PATH_CHARS},
        )
    if "\x00" in path:
        raise InvalidInput(f"{field} contains NUL", code="invalid_path", details={"field": field})
    if not path.startswith("/"):
        raise InvalidInput(
            f"{field} must start with / (one of /{', /'.join(ROOTS)})",
            code="invalid_path",
            details={"field": field},
        )
    body = path[1:].removesuffix("/") if path != "/" else ""
    segments = body.split("/") if body else []
    for segment in segments:
        if segment == "":
            raise InvalidInput(
                f"{field} has an empty segment (//)", code="invalid_path", details={"field": field}
            )
        if segment in (".", ".."):
            raise InvalidInput(
                f"{field} has a {segment!r} segment; paths are never resolved relatively",
                code="invalid_path",
                details={"field": field},
            )
        if any(c.isspace() or ord(c) < 32 for c in segment):
            raise InvalidInput(
                f"{field} has whitespace or a control character in a segment",
                code="invalid_path",
                details={"field": field},
            )
    if segments and segments[0] not in ROOTS:
        raise InvalidInput(
            f"{field} must be under one of /{', /'.join(ROOTS)}",
            code="invalid_path",
            details={"field": field},
        )
    return segments


def join(*segments: str) -> str:
    return "/" + "/".join(segments)


def slug(text: str, limit: int) -> str:
    """``text`` with slashes, backslashes and whitespace runs turned into ``-``, backticks
    dropped and ``$(`` written ``(`` (the safe shell refuses both even quoted, so a listed name
    must not hold them), at most ``limit`` characters (``_`` when nothing is left)."""
    value = text.replace("`", "").replace("$(", "(")
    value = _SEPARATORS.sub("-", value).strip("-")
    value = "".join(c for c in value if ord(c) >= 32)[:limit].rstrip("-")
    if value in ("", ".", ".."):
        value = "_" + value
    return value


def short_hash(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:8]


def document_name(filename: str, document_id) -> str:
    """``<slug>--<8hex>``: the filename's slug and the first 8 hex digits of the document id."""
    return f"{slug(filename, MAX_SLUG_CHARS)}--{document_id.hex[:8]}"


def section_name(generation, section_path: tuple[str, ...]) -> str:
    """``<heading path joined by -->--<8hex>.md``; the hash binds it to the generation."""
    stem = "--".join(slug(s, MAX_SECTION_CHARS) for s in section_path) or "_body"
    stem = stem[:MAX_SECTION_CHARS].rstrip("-") or "_body"
    return f"{stem}--{short_hash(str(generation), 'section', *section_path)}.md"
