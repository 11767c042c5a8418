"""The keyset paginations of every app's API and the checks they share (docs/api.md,
"Pagination"): ``?limit=`` outside 1..max is 400 ``invalid_limit`` naming the range, never
silently replaced by the default; a ``?cursor=`` that decodes to nothing (``%00``), that DRF
cannot read, or whose position the paginator cannot compare is 400 ``invalid_cursor``, never
the first page (a crafted cursor must not reach the query).
"""

from __future__ import annotations

import binascii
from base64 import b64decode
from datetime import timedelta

from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination

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


def _not_issued() -> InvalidInput:
    return InvalidInput("the cursor is not one this API issued", code="invalid_cursor")


class KeysetPagination(CursorPagination):
    """DRF's cursor pagination with the checks above; ``?limit=`` up to :attr:`max_page_size`.
    A subclass sets ``ordering`` and :meth:`valid_position` (what its ordering can compare)."""

    page_size_query_param = "limit"
    max_page_size = 100

    def get_page_size(self, request):
        """``?limit=`` 1..max (400 ``invalid_limit`` outside), else the default."""
        return page_size(request, self.page_size_query_param, self.page_size, self.max_page_size)

    def valid_position(self, position: str) -> bool:
        """Whether a decoded cursor's position may reach the query."""
        raise NotImplementedError

    def decode_cursor(self, request):
        """DRF's cursor, refused with 400 ``invalid_cursor`` unless it is one this API issued
        and its position passes :meth:`valid_position`."""
        require_issued_cursor(request, self.cursor_query_param)
        try:
            cursor = super().decode_cursor(request)
        except NotFound:
            raise _not_issued() from None
        if cursor is not None and cursor.position is not None:
            if not self.valid_position(cursor.position):
                raise _not_issued()
        return cursor


class NewestFirstPagination(KeysetPagination):
    """Keyset pagination, newest first; ``?limit=`` up to 100 (default 20)."""

    page_size = 20
    ordering = ("-created_at", "-id")

    def valid_position(self, position: str) -> bool:
        """A datetime the database can compare (years 2..9998, offset under 15 hours)."""
        moment = parse_datetime(position)
        try:
            valid = (
                moment is not None
                and 1 < moment.year < 9999
                and (moment.utcoffset() is None or abs(moment.utcoffset()) < timedelta(hours=15))
            )
        except (OverflowError, ValueError):
            valid = False
        return valid
