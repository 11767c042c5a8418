"""The keyset paginations of every app's API and the checks they share (docs/api.md,
"Pagination").

A page is ``{"next", "previous", "results"}``; ``next`` and ``previous`` are URLs carrying an
opaque ``?cursor=``. The cursor holds the ordering key of the row it continues from (for the
newest-first listings ``(created_at, id)``, the id breaking ties) and the direction, signed
with Django's signing (``SECRET_KEY``) under a salt naming the listing: its route, its path
arguments (the space, the task), its filters (every query parameter but ``cursor`` and
``limit``) and the caller's tenant. So a row created between two page reads is never returned
twice and none is skipped, and a cursor that was edited, forged, or issued for another listing,
space, filter or tenant is 400 ``invalid_cursor`` (it never reaches the query).

``?limit=`` outside 1..max is 400 ``invalid_limit`` naming the range, never silently replaced by
the default; the limit is not bound to the cursor (a client may change it between pages).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.core import signing
from django.db.models import Field, Model, Q, QuerySet
from rest_framework.pagination import BasePagination
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from .errors import InvalidInput

if TYPE_CHECKING:  # annotations only: the views import this module
    from rest_framework.request import Request
    from rest_framework.views import APIView

SALT_PREFIX = "knowledgefs.pagination"

_M = TypeVar("_M", bound=Model)
#: A cursor's ordering key: one JSON-ready value per ordering field.
CursorValue = int | float | str | None


def page_size(request: Request, param: str, default: int, maximum: int) -> int:
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


def invalid_cursor() -> InvalidInput:
    """400 ``invalid_cursor``: the cursor is not one this API issued for this listing."""
    return InvalidInput(
        "the cursor is not one this API issued for this listing (changed, forged, or from "
        "another listing or filter); start again without a cursor",
        code="invalid_cursor",
        details={"field": "cursor"},
    )


def listing_salt(listing: str, binding: dict[str, Any]) -> str:
    """The signing salt of one listing: its name and a digest of what it is bound to."""
    digest = hashlib.sha256(
        json.dumps(binding, sort_keys=True, default=str).encode("utf-8")
    ).hexdigest()
    return f"{SALT_PREFIX}:{listing}:{digest}"


def _encode_value(value: object) -> CursorValue:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, int | float | str) or value is None:
        return value
    return str(value)


def encode_cursor(key: list[Any], backwards: bool, salt: str) -> str:
    """The signed cursor continuing after ``key`` (``backwards``: before it)."""
    return signing.dumps({"k": key, "b": int(backwards)}, salt=salt)


def decode_cursor(
    raw: str | None, salt: str, ordering: Sequence[str], model: type[Model]
) -> tuple[list[Any] | None, bool]:
    """``(key, backwards)`` of a cursor issued under ``salt`` (``(None, False)`` for none or
    an empty one); 400 ``invalid_cursor`` unless its signature, salt and shape hold."""
    if raw is None or raw == "":
        return None, False
    try:
        payload = signing.loads(raw, salt=salt)
    except (signing.BadSignature, ValueError, UnicodeError):
        raise invalid_cursor() from None
    if not (
        isinstance(payload, dict)
        and payload.get("b") in (0, 1)
        and isinstance(payload.get("k"), list)
        and len(payload["k"]) == len(ordering)
    ):
        raise invalid_cursor()
    key: list[Any] = []
    for name, raw_value in zip(ordering, payload["k"], strict=True):
        field = model._meta.get_field(name.lstrip("-"))
        if not isinstance(field, Field):  # a reverse relation reads no value
            raise invalid_cursor()
        try:
            key.append(field.to_python(raw_value))
        except Exception:  # noqa: BLE001 - any unreadable value is an invalid cursor
            raise invalid_cursor() from None
    return key, bool(payload["b"])


def after(ordering: Sequence[str], key: list[Any], backwards: bool = False) -> Q:
    """Rows strictly after ``key`` in the reading direction (a lexicographic keyset over
    ``ordering``, e.g. ``created_at < t OR (created_at = t AND id < i)`` newest first)."""
    condition = Q()
    equal = Q()
    for name, value in zip(ordering, key, strict=True):
        field = name.lstrip("-")
        descending = name.startswith("-") != backwards
        step = Q(**{f"{field}__{'lt' if descending else 'gt'}": value})
        condition |= equal & step
        equal &= Q(**{field: value})
    return condition


def row_key(row: object, ordering: Sequence[str]) -> list[Any]:
    """The JSON-ready ordering key of ``row``."""
    return [_encode_value(getattr(row, name.lstrip("-"))) for name in ordering]


def page_of(
    queryset: QuerySet[_M],
    *,
    limit: int | None,
    cursor: str | None,
    listing: str,
    binding: dict[str, Any],
    ordering: Sequence[str] = ("-created_at", "-id"),
) -> tuple[list[_M], str | None]:
    """One forward page for callers without a request (the ``kfs`` listings): ``(rows,
    next_cursor)``; ``limit=None`` reads every row after the cursor. The cursor is signed as the
    API's, bound to ``listing`` and ``binding`` (its filters); 400 ``invalid_cursor`` (a
    :class:`~knowledgefs.errors.InvalidInput`) otherwise."""
    salt = listing_salt(listing, {"ordering": list(ordering), **binding})
    key, backwards = decode_cursor(cursor, salt, ordering, queryset.model)
    if backwards:
        raise invalid_cursor()
    rows = queryset.order_by(*ordering)
    if key is not None:
        rows = rows.filter(after(ordering, key))
    if limit is None:
        return list(rows), None
    page = list(rows[: limit + 1])
    if len(page) <= limit:
        return page, None
    page = page[:limit]
    return page, encode_cursor(row_key(page[-1], ordering), False, salt)


class KeysetPagination(BasePagination):
    """Keyset pagination over :attr:`ordering` (every field in the same direction; the last a
    unique tie-breaker) with signed, listing-bound cursors; ``?limit=`` up to
    :attr:`max_page_size` (default :attr:`page_size`).

    Used by the views as DRF's paginators are: ``paginate_queryset`` then
    ``get_paginated_response``. ``listing`` names the listing in the salt (default: the
    route's URL name)."""

    page_size = 20
    max_page_size = 100
    page_size_query_param = "limit"
    cursor_query_param = "cursor"
    ordering: tuple[str, ...] = ("-created_at", "-id")
    # Set by paginate_queryset for the page's links.
    request: Request
    _salt: str
    next_key: list[Any] | None
    previous_key: list[Any] | None

    def __init__(self, listing: str | None = None, page_size: int | None = None) -> None:
        self.listing = listing
        if page_size is not None:
            self.page_size = page_size

    # The cursor.

    def salt(self, request: Request) -> str:
        """The salt binding a cursor to this route, its path arguments and filters and the
        caller's tenant."""
        match = getattr(request, "resolver_match", None)
        listing = self.listing or (match.view_name if match else request.path)
        ignored = {self.cursor_query_param, self.page_size_query_param}
        filters = {
            key: request.query_params.getlist(key)
            for key in sorted(request.query_params)
            if key not in ignored
        }
        binding = {
            "ordering": list(self.ordering),
            "route": match.route if match else request.path,
            "args": dict(match.kwargs) if match else {},
            "filters": filters,
            "tenant": str(getattr(request.user, "tenant_id", "") or ""),
        }
        return listing_salt(listing, binding)

    def encode_cursor(self, key: list[Any], backwards: bool) -> str:
        return encode_cursor(key, backwards, self._salt)

    def decode_cursor(self, request: Request, model: type[Model]) -> tuple[list[Any] | None, bool]:
        """``(key, backwards)`` of the request's cursor (``(None, False)`` without one); 400
        ``invalid_cursor`` unless its signature, salt and shape are this listing's."""
        raw = request.query_params.get(self.cursor_query_param)
        return decode_cursor(raw, self._salt, self.ordering, model)

    # The query.

    def get_page_size(self, request: Request) -> int:
        """``?limit=`` 1..max (400 ``invalid_limit`` outside), else the default."""
        return page_size(request, self.page_size_query_param, self.page_size, self.max_page_size)

    def paginate_queryset(
        self,
        queryset: QuerySet[Any, Any] | Sequence[Any],
        request: Request,
        view: APIView | None = None,
    ) -> list[Any]:
        if not isinstance(queryset, QuerySet):
            raise TypeError("keyset pagination reads a queryset, not a sequence")
        self.request = request
        self._salt = self.salt(request)
        limit = self.get_page_size(request)
        key, backwards = self.decode_cursor(request, queryset.model)
        ordering = self.ordering
        if backwards:
            ordering = tuple(n[1:] if n.startswith("-") else f"-{n}" for n in ordering)
        ordered = queryset.order_by(*ordering)
        if key is not None:
            ordered = ordered.filter(after(self.ordering, key, backwards))
        rows = list(ordered[: limit + 1])
        more = len(rows) > limit
        rows = rows[:limit]
        if backwards:
            rows.reverse()
        self.next_key = self.previous_key = None
        if rows:
            if more or backwards:
                self.next_key = row_key(rows[-1], self.ordering)
            if (more and backwards) or (key is not None and not backwards):
                self.previous_key = row_key(rows[0], self.ordering)
        return rows

    # The page.

    def _link(self, key: list[Any] | None, backwards: bool) -> str | None:
        if key is None:
            return None
        url = self.request.build_absolute_uri()
        return replace_query_param(url, self.cursor_query_param, self.encode_cursor(key, backwards))

    def get_next_link(self) -> str | None:
        return self._link(self.next_key, False)

    def get_previous_link(self) -> str | None:
        return self._link(self.previous_key, True)

    def get_paginated_response(self, data: Any) -> Response:
        return Response(
            {
                "next": self.get_next_link(),
                "previous": self.get_previous_link(),
                "results": data,
            }
        )


class NewestFirstPagination(KeysetPagination):
    """Keyset pagination on ``(created_at, id)``, newest first; ``?limit=`` up to 100
    (default 20)."""

    page_size = 20
    ordering = ("-created_at", "-id")


#: The largest ``kfs … --limit`` (the command line pages in bigger steps than the API).
CLI_MAX_LIMIT = 1000


def add_page_arguments(parser: argparse.ArgumentParser, default: int) -> None:
    """``--limit N`` (1..:data:`CLI_MAX_LIMIT`, default ``default``), ``--all`` and
    ``--cursor C`` of a ``kfs`` listing; its output carries ``next_cursor``."""
    parser.add_argument(
        "--limit",
        type=int,
        default=default,
        help=f"rows per page, 1 to {CLI_MAX_LIMIT} (default {default})",
    )
    parser.add_argument("--all", action="store_true", help="every row (ignores --limit)")
    parser.add_argument("--cursor", help="continue after a page: its next_cursor")


def cli_page(
    queryset: QuerySet[_M], options: dict[str, Any], *, listing: str, binding: dict[str, Any]
) -> tuple[list[_M], str | None]:
    """The page a ``kfs`` listing asked for with :func:`add_page_arguments`' options:
    ``(rows, next_cursor)``; 400-style ``invalid_limit`` / ``invalid_cursor``
    (:class:`~knowledgefs.errors.InvalidInput`, exit status 1 through ``kfs``)."""
    limit = options.get("limit")
    if not options.get("all") and not (isinstance(limit, int) and 1 <= limit <= CLI_MAX_LIMIT):
        raise InvalidInput(
            f"--limit must be an integer from 1 to {CLI_MAX_LIMIT}, not {limit!r}",
            code="invalid_limit",
        )
    return page_of(
        queryset,
        limit=None if options.get("all") else limit,
        cursor=options.get("cursor"),
        listing=f"kfs.{listing}",
        binding=binding,
    )
