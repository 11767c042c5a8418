"""Retrieval filters: typed conditions on document metadata, plus document, type and date filters.

Shape (every member optional; ``null`` or ``{}`` is no filter)::

    {"logical_operator": "and" | "or",                      # how conditions combine; "and"
     "conditions": [{"name", "field_type", "comparison_operator", "value"}],   # ≤ 50
     "document_ids": ["<uuid>", …],                         # ≤ 100
     "document_types": ["application/pdf", …],              # MIME types, ≤ 100
     "created_after": "2025-01-01T00:00:00Z", "created_before": "…"}   # ISO 8601

The limits (50 conditions, 100 ids/types) are the inventory's (§3.4). ``conditions`` test
``Document.metadata``; the other members AND with them. Operators per ``field_type``:

- ``string``: ``is``, ``is not``, ``contains``, ``not contains``, ``starts with``,
  ``ends with``, ``in``, ``not in`` (value: a list of strings, ≤ 100), ``is empty``,
  ``is not empty``; text comparisons are case-sensitive;
- ``number``: ``=``, ``≠``, ``>``, ``<``, ``≥``, ``≤`` (ASCII ``!=``, ``>=``, ``<=`` too),
  ``is empty``, ``is not empty``; a stored JSON number, or a string of plain ASCII decimal
  notation (``"7.5"``, ``"-3"``, ``"1e3"``; not ``"1_000"``, ``"٣"``, ``"inf"``), compares
  numerically; the value must be a finite number within ±1.7976931348623157e308 (a double);
- ``date``: ``before``, ``after``, ``is`` (value ISO 8601; ``is`` with a date-only value
  matches the calendar day, with a time the instant; naive times are UTC), ``is empty``,
  ``is not empty``;
- ``boolean``: ``is`` (value ``true``/``false``; a stored ``"true"``/``"false"`` string counts).

``is empty`` matches a document whose key is missing, ``null`` or ``""``; ``is not empty`` is its
exact opposite. A negative operator (``is not``, ``not contains``, ``not in``, ``≠``) is the
exact complement of its positive one, so a document without the key matches it. A stored value
of the wrong type (text where a number is expected) matches no positive operator, and so does a
stored value that cannot be compared: a number beyond a double's range (a 401-digit integer) or
a date-time outside 0001-01-01T00:00:00Z … 9999-12-31T23:59:59.999999Z once moved to UTC
(``9999-12-31T23:59:59-14:00``). Request values outside those ranges are refused (400
``invalid_filter`` naming the condition and the range).

At most 50 conditions and 100 ids, types or ``in`` values per list; a refusal is a 400 whose
message names ``filters.<member>`` or ``filters.conditions[<i>].<field>`` (codes: docs/api.md).

:func:`resolve` turns filters into the set of allowed documents with one ORM query (the
space's enabled, published documents; ids, types and dates in SQL, metadata conditions
evaluated over the rows' metadata); both legs are then restricted to that set before their
limit (:mod:`retrieval.backends`). Given the snapshot's publication head revision, the set is
kept in this process under ``(space, revision, filters)``: every change a filter reads
(publish, replace, delete, enable/disable, a metadata patch) moves the head, so a query at a
newer revision resolves again.
"""

from __future__ import annotations

import math
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import NoReturn

from knowledgefs.errors import InvalidInput

MAX_CONDITIONS = 50
MAX_VALUES = 100
FIELD_TYPES = ("string", "number", "date", "boolean")
EMPTY = ("is empty", "is not empty")
OPERATORS = {
    "string": (
        "is",
        "is not",
        "contains",
        "not contains",
        "starts with",
        "ends with",
        "in",
        "not in",
        *EMPTY,
    ),
    "number": ("=", "≠", ">", "<", "≥", "≤", *EMPTY),
    "date": ("before", "after", "is", *EMPTY),
    "boolean": ("is",),
}
ALIASES = {"!=": "≠", ">=": "≥", "<=": "≤"}
NUMBER_RANGE = "±1.7976931348623157e308"
DATE_RANGE = "0001-01-01T00:00:00Z … 9999-12-31T23:59:59.999999Z"
# Plain ASCII decimal notation (no "_" separators, no other scripts' digits, no inf/nan).
DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
MEMBERS = (
    "logical_operator",
    "conditions",
    "document_ids",
    "document_types",
    "created_after",
    "created_before",
)
NEGATIONS = {
    "is not": "is",
    "not contains": "contains",
    "not in": "in",
    "≠": "=",
    "is not empty": "is empty",
}


#: A condition's parsed value: a string or a tuple of strings (``in``), a float, a datetime, a
#: bool; ``None`` for ``is empty`` and ``is not empty``.
ConditionValue = str | tuple[str, ...] | float | datetime | bool | None


@dataclass(frozen=True)
class Condition:
    """One checked metadata condition; ``value`` is parsed (:data:`ConditionValue`)."""

    name: str
    field_type: str
    operator: str
    value: ConditionValue
    date_only: bool = False

    def matches(self, metadata: dict) -> bool:
        """Whether a document's ``metadata`` satisfies this condition (module rules)."""
        if self.operator in NEGATIONS:
            positive = Condition(self.name, self.field_type, NEGATIONS[self.operator], self.value)
            return not positive.matches(metadata)
        stored = metadata.get(self.name) if isinstance(metadata, dict) else None
        if self.operator == "is empty":
            return stored is None or stored == ""
        return _COMPARE[self.field_type](self, stored)


@dataclass(frozen=True)
class Filters:
    """Checked filters (:func:`parse`); ``None`` members are not set."""

    logical_operator: str = "and"
    conditions: tuple[Condition, ...] = ()
    document_ids: tuple[uuid.UUID, ...] | None = None
    document_types: tuple[str, ...] | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None

    def matches_metadata(self, metadata: dict) -> bool:
        """The conditions combined with ``logical_operator`` (no conditions: ``True``)."""
        if not self.conditions:
            return True
        combine = all if self.logical_operator == "and" else any
        return combine(c.matches(metadata) for c in self.conditions)


@dataclass(frozen=True)
class Allowed:
    """Filters resolved against one space: the documents both legs may return.

    ``document_ids`` is a frozenset (may be empty: nothing matches, no leg runs);
    ``considered`` the enabled published documents the filter looked at; ``duration_ms`` the
    resolution's time.
    """

    document_ids: frozenset
    considered: int
    duration_ms: float

    @property
    def filtered(self) -> int:
        return self.considered - len(self.document_ids)


def parse(raw) -> Filters | Allowed | None:
    """Check a request's ``filters``; ``None`` (or ``{}``) means no filter.

    Raises :class:`InvalidInput` with the codes of the module docstring. An :class:`Allowed`
    (a set resolved by the caller, e.g. a replay's frozen publication) is returned as is.
    """
    if raw is None or isinstance(raw, (Filters, Allowed)):
        return raw
    if not isinstance(raw, dict):
        _fail("filters", "must be a JSON object or null")
    unknown = sorted(set(raw) - set(MEMBERS))
    if unknown:
        _fail(f"filters.{unknown[0]}", f"is not a filter member (members: {', '.join(MEMBERS)})")
    if not raw:
        return None
    operator = raw.get("logical_operator", "and")
    if operator not in ("and", "or"):
        _fail("filters.logical_operator", "must be 'and' or 'or'")
    conditions = raw.get("conditions", [])
    if not isinstance(conditions, list):
        _fail("filters.conditions", "must be a list of conditions")
    if len(conditions) > MAX_CONDITIONS:
        raise InvalidInput(
            f"filters.conditions has {len(conditions)} conditions; the limit is {MAX_CONDITIONS}",
            code="too_many_filter_conditions",
            details={"field": "filters.conditions", "limit": MAX_CONDITIONS},
        )
    return Filters(
        logical_operator=operator,
        conditions=tuple(_condition(i, c) for i, c in enumerate(conditions)),
        document_ids=_document_ids(raw.get("document_ids")),
        document_types=_document_types(raw.get("document_types")),
        created_after=_optional_datetime(raw.get("created_after"), "filters.created_after"),
        created_before=_optional_datetime(raw.get("created_before"), "filters.created_before"),
    )


#: Resolved filters kept by :func:`resolve` (least recently used dropped first).
ALLOWED_CACHE_SIZE = 256
_allowed: OrderedDict[tuple, Allowed] = OrderedDict()
_allowed_lock = threading.Lock()


def resolve(space, filters, *, head_revision: int | None = None) -> Allowed | None:
    """The documents of ``space`` that ``filters`` allow, with one ORM query (plus one count of
    the documents considered when ids, types or dates narrowed the rows in SQL).

    ``filters`` is raw (checked here), :class:`Filters`, an :class:`Allowed` (returned as is)
    or ``None`` (returns ``None``: no restriction). Only enabled documents with a published
    generation are considered. ``head_revision`` (the snapshot's publication head, read before
    this call): the set resolved for the same space, revision and filters in this process is
    returned without a query (module docstring); ``None`` always queries.
    """
    if filters is None or isinstance(filters, Allowed):
        return filters
    filters = parse(filters)
    if filters is None:
        return None
    started = time.perf_counter()
    key = None if head_revision is None else (space.id, head_revision, filters)
    if key is not None:
        with _allowed_lock:
            held = _allowed.get(key)
            if held is not None:
                _allowed.move_to_end(key)
        if held is not None:
            return Allowed(held.document_ids, held.considered, _since(started))
    allowed = _query(space, filters, started)
    if key is not None:
        with _allowed_lock:
            _allowed[key] = allowed
            while len(_allowed) > ALLOWED_CACHE_SIZE:
                _allowed.popitem(last=False)
    return allowed


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _query(space, filters: Filters, started: float) -> Allowed:
    """:func:`resolve`'s query."""
    from ingestion.models import Document

    rows = Document.objects.filter(space_id=space.id, enabled=True, active_generation__isnull=False)
    if filters.document_ids is not None:
        rows = rows.filter(id__in=filters.document_ids)
    if filters.document_types is not None:
        rows = rows.filter(mime_type__in=filters.document_types)
    if filters.created_after is not None:
        rows = rows.filter(created_at__gt=filters.created_after)
    if filters.created_before is not None:
        rows = rows.filter(created_at__lt=filters.created_before)
    if filters.conditions:
        pairs = list(rows.values_list("id", "metadata"))
        allowed = frozenset(i for i, meta in pairs if filters.matches_metadata(meta or {}))
        matched = len(pairs)
    else:
        allowed = frozenset(rows.values_list("id", flat=True))
        matched = len(allowed)
    considered = _considered(space, filters, matched)
    return Allowed(allowed, considered, _since(started))


def _considered(space, filters: Filters, matched_in_sql: int) -> int:
    """Documents the filter looked at: the enabled published ones (one more count query only
    when SQL already narrowed the rows)."""
    sql_narrowed = (
        filters.document_ids is not None
        or filters.document_types is not None
        or filters.created_after is not None
        or filters.created_before is not None
    )
    if not sql_narrowed:
        return matched_in_sql
    from ingestion.models import Document

    return Document.objects.filter(
        space_id=space.id, enabled=True, active_generation__isnull=False
    ).count()


# --- checking --------------------------------------------------------------------------------


def _fail(field: str, problem: str, code: str = "invalid_filter") -> NoReturn:
    raise InvalidInput(f"{field} {problem}", code=code, details={"field": field})


def _condition(index: int, raw) -> Condition:
    where = f"filters.conditions[{index}]"
    if not isinstance(raw, dict):
        _fail(where, "must be an object {name, field_type, comparison_operator, value}")
    extra = sorted(set(raw) - {"name", "field_type", "comparison_operator", "value"})
    if extra:
        _fail(f"{where}.{extra[0]}", "is not a condition member")
    name = raw.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= 255:
        _fail(f"{where}.name", "must be a metadata key of 1 to 255 characters")
    field_type = raw.get("field_type")
    if field_type not in FIELD_TYPES:
        _fail(f"{where}.field_type", f"must be one of: {', '.join(FIELD_TYPES)}")
    operator = raw.get("comparison_operator")
    operator = ALIASES.get(operator, operator) if isinstance(operator, str) else operator
    if operator not in OPERATORS[field_type]:
        _fail(
            f"{where}.comparison_operator",
            f"{raw.get('comparison_operator')!r} is not an operator for {field_type} "
            f"(operators: {', '.join(OPERATORS[field_type])})",
        )
    field = f"{where}.value"
    value = raw.get("value")
    if operator in EMPTY:
        if value is not None:
            _fail(field, f"must be null or left out for {operator!r}")
        return Condition(name, field_type, operator, None)
    if field_type == "string":
        value = _string_value(field, operator, value)
    elif field_type == "number":
        value = _as_float(value)
        if value is None:
            _fail(field, f"must be a finite number within {NUMBER_RANGE}")
    elif field_type == "date":
        if not isinstance(value, str):
            _fail(field, "must be an ISO 8601 date or date-time string")
        date_only = len(value.strip()) == 10
        return Condition(name, field_type, operator, _parse_datetime(value, field), date_only)
    elif not isinstance(value, bool):
        _fail(field, "must be true or false")
    return Condition(name, field_type, operator, value)


def _string_value(field: str, operator: str, value):
    if operator in ("in", "not in"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            _fail(field, f"must be a list of strings for {operator!r}")
        if not value:
            _fail(field, f"must list at least one string for {operator!r}")
        if len(value) > MAX_VALUES:
            _fail(field, f"lists {len(value)} values; the limit is {MAX_VALUES}",
                  code="too_many_filter_values")  # fmt: skip
        return tuple(value)
    if not isinstance(value, str):
        _fail(field, f"must be a string for {operator!r}")
    return value


def _document_ids(raw) -> tuple[uuid.UUID, ...] | None:
    if raw is None:
        return None
    field = "filters.document_ids"
    if not isinstance(raw, list):
        _fail(field, "must be a list of document ids")
    if len(raw) > MAX_VALUES:
        _fail(field, f"lists {len(raw)} ids; the limit is {MAX_VALUES}",
              code="too_many_filter_values")  # fmt: skip
    ids = []
    for i, value in enumerate(raw):
        try:
            ids.append(uuid.UUID(value) if isinstance(value, str) else uuid.UUID(""))
        except ValueError:
            _fail(f"{field}[{i}]", "is not a document id (a UUID)")
    return tuple(ids)


def _document_types(raw) -> tuple[str, ...] | None:
    if raw is None:
        return None
    field = "filters.document_types"
    if not isinstance(raw, list) or not all(isinstance(v, str) and "/" in v for v in raw):
        _fail(field, "must be a list of MIME types (such as application/pdf)")
    if len(raw) > MAX_VALUES:
        _fail(field, f"lists {len(raw)} types; the limit is {MAX_VALUES}",
              code="too_many_filter_values")  # fmt: skip
    return tuple(v.lower() for v in raw)


def _optional_datetime(raw, field: str) -> datetime | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        _fail(field, "must be an ISO 8601 date or date-time string")
    return _parse_datetime(raw, field)


def _parse_datetime(raw: str, field: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(raw.strip())
    except ValueError:
        _fail(field, f"{raw[:40]!r} is not an ISO 8601 date or date-time")
    value = _as_datetime(parsed)
    if value is None:
        _fail(field, f"{raw[:40]!r} is out of range: dates must lie within {DATE_RANGE} in UTC")
    return value


def _as_datetime(raw) -> datetime | None:
    """A stored or requested date as an aware UTC datetime, else ``None``."""
    if isinstance(raw, datetime):
        value = raw
    elif isinstance(raw, date):
        value = datetime(raw.year, raw.month, raw.day)
    elif isinstance(raw, str):
        try:
            value = datetime.fromisoformat(raw.strip())
        except ValueError:
            return None
    else:
        return None
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-14:00 is past datetime.max in UTC
        return None


def _as_float(value) -> float | None:
    """A JSON number as a finite float, else ``None`` (bools, text, ±inf, NaN, and integers
    beyond a double's range, which ``float()`` refuses with OverflowError)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _stored_number(stored) -> float | None:
    """A stored metadata value as a finite float: a JSON number or a string of plain ASCII
    decimal notation (:data:`DECIMAL`); anything else is ``None`` (it matches nothing)."""
    if isinstance(stored, str):
        if not DECIMAL.fullmatch(stored.strip()):
            return None
        stored = float(stored.strip())  # the pattern admits only what float() parses
    return _as_float(stored)


# --- matching --------------------------------------------------------------------------------


def _string(condition: Condition, stored) -> bool:
    if not isinstance(stored, str):
        return False
    value, op = condition.value, condition.operator
    if op == "is":
        return stored == value
    if op == "in":
        assert isinstance(value, tuple)  # _string_value: a tuple of strings for "in"
        return stored in value
    assert isinstance(value, str)  # _string_value: a string for the other operators
    if op == "contains":
        return value in stored
    if op == "starts with":
        return stored.startswith(value)
    return stored.endswith(value)  # "ends with"


def _number(condition: Condition, stored) -> bool:
    stored = _stored_number(stored)
    if stored is None:
        return False
    value, op = condition.value, condition.operator
    return {
        "=": stored == value,
        ">": stored > value,
        "<": stored < value,
        "≥": stored >= value,
        "≤": stored <= value,
    }[op]


def _date(condition: Condition, stored) -> bool:
    moment = _as_datetime(stored)
    if moment is None:
        return False
    value, op = condition.value, condition.operator
    assert isinstance(value, datetime)  # _condition: a date's value is parsed to a datetime
    if op == "before":
        return moment < value
    if op == "after":
        return moment > value
    if condition.date_only:
        return moment.date() == value.date()
    return moment == value


def _boolean(condition: Condition, stored) -> bool:
    if isinstance(stored, str) and stored.lower() in ("true", "false"):
        stored = stored.lower() == "true"
    return isinstance(stored, bool) and stored == condition.value


_COMPARE = {"string": _string, "number": _number, "date": _date, "boolean": _boolean}
