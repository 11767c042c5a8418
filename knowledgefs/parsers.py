"""The JSON body parser of the API: JSON, and no NUL character in any text.

PostgreSQL ``text`` and ``jsonb`` cannot hold U+0000 (psycopg refuses the value, which was a 500
once it reached a query), SQLite would store it silently, and no member of any body means a NUL.
So a body with U+0000 in any string — a value or an object key, at any depth — is refused
before a view reads it, the same on every engine: 400 ``invalid_request`` naming the member
(``tags[0]``, ``metadata.<key>``), as DRF's own serializer fields already refuse it
("Null characters are not allowed."). Found by property-based tests against the OpenAPI document
(docs/testing.md, "Schemathesis").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from rest_framework.parsers import JSONParser

from .errors import InvalidInput

NUL = "\x00"


class TextJSONParser(JSONParser):
    """:class:`rest_framework.parsers.JSONParser` that refuses U+0000 in any string
    (:func:`refuse_nul`); malformed JSON stays 400 ``malformed_request``."""

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        data = super().parse(stream, media_type, parser_context)
        refuse_nul(data)
        return data


def refuse_nul(data: Any) -> None:
    """Raise :class:`~knowledgefs.errors.InvalidInput` (400 ``invalid_request``, ``details.field``)
    for the first string holding U+0000 in ``data`` (parsed JSON), walked without recursion so a
    deep document costs no stack."""
    pending: list[tuple[str, Any]] = [("", data)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, str):
            if NUL in value:
                _refuse(path or "body")
        elif isinstance(value, dict):
            for key, item in value.items():
                member = f"{path}.{key}" if path else str(key)
                if NUL in str(key):
                    _refuse(member.replace(NUL, "\\u0000"), key=True)
                pending.append((member, item))
        elif isinstance(value, list):
            pending.extend((f"{path}[{n}]", item) for n, item in enumerate(value))


def _refuse(field: str, *, key: bool = False) -> None:
    what = "a member name" if key else "text"
    raise InvalidInput(
        f"{field}: {what} must not contain the NUL character (U+0000)",
        code="invalid_request",
        details={"field": field},
    )
