"""Checks shared by the keyset paginations (docs/api.md, "Pagination"): ``?limit=`` outside
1..max is 400 ``invalid_limit`` naming the range, never silently replaced by the default; a
``?cursor=`` that decodes to nothing (``%00``) is 400 ``invalid_cursor``, never the first page.
"""

from __future__ import annotations

import binascii
from base64 import b64decode

from .errors import InvalidInput


def page_size(request, param: str, default: int, maximum: int) -> int:
    """The requested page size: ``default`` when ``param`` is absent, else an integer within
    ``1..maximum`` (400 ``invalid_limit`` otherwise, the message naming the range)."""
    raw = request.query_params.get(param)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= maximum:
        raise InvalidInput(
            f"limit must be an integer from 1 to {maximum}, not {raw[:20]!r}",
            code="invalid_limit",
            details={"field": "limit", "min": 1, "max": maximum},
        )
    return int(raw)


def require_issued_cursor(request, param: str = "cursor") -> None:
    """400 ``invalid_cursor`` for a non-empty cursor that decodes to no position, offset or
    direction (an issued cursor always names one; DRF would read it as the first page)."""
    raw = request.query_params.get(param)
    if not raw:
        return
    try:
        decoded = b64decode(raw.encode("ascii")).decode("ascii")
    except (UnicodeError, binascii.Error, ValueError):
        decoded = ""
    if not any(token in decoded for token in ("o=", "r=", "p=")):
        raise InvalidInput("the cursor is not one this API issued", code="invalid_cursor")
