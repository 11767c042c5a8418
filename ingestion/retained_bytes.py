"""A conservative, bounded estimate of the memory a parse artifact keeps alive.

:func:`estimate_retained_bytes` charges the leases of the retained-artifact gate
(:func:`ingestion.memory_gates.retained_artifact_gate`); the per-object charges are the constants
below. It is an admission estimate (production deployment guide, "Canonical artifact retention
bounds"), not a heap measurement. Pure Python, no Django imports.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import sys
from collections.abc import Iterator
from typing import Any

#: Per string: object header (CPython's str header is 40-80 bytes, V8's 12-16); the body is
#: charged 2 bytes per UTF-16 code unit (astral characters are two units).
STRING_OVERHEAD = 56
#: Per dict / object (CPython's empty dict is 64 bytes) ...
OBJECT_OVERHEAD = 64
#: ... plus per property (hash-table entry and key/value references); the key itself is charged
#: as a string every time it appears (interning makes that conservative).
PROPERTY_OVERHEAD = 32
#: Per list / tuple (CPython's list header is 56 bytes) plus one reference per element.
ARRAY_OVERHEAD = 56
ELEMENT_OVERHEAD = 8
#: Per int / float (CPython: 24-28 bytes for small values); None and booleans are shared
#: singletons and cost only their container's reference.
NUMBER_BYTES = 32
#: Per bytes / bytearray, plus their length.
BYTES_OVERHEAD = 40

_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def _string_bytes(text: str, remaining: int) -> int:
    charge = STRING_OVERHEAD + 2 * len(text)
    if charge >= remaining or text.isascii() or max(text) <= "\uffff":
        return charge
    return charge + 2 * sum(1 for _ in _ASTRAL.finditer(text))


def estimate_retained_bytes(obj: Any, ceiling: int) -> int:
    """A conservative estimate (bytes) of the memory ``obj`` keeps alive, capped at ``ceiling``.

    Walks the object graph in place (an explicit stack of iterators: no recursion limit, no
    ``json.dumps``, no string copies) and returns ``ceiling`` as soon as the running total reaches
    it, so the cost is bounded by the ceiling rather than by the artifact. Charges, in bytes (see
    the constants above): strings ``STRING_OVERHEAD + 2 × UTF-16 code units``; dicts
    ``OBJECT_OVERHEAD + PROPERTY_OVERHEAD`` per key plus keys and values; lists/tuples
    ``ARRAY_OVERHEAD + ELEMENT_OVERHEAD`` per element plus elements; ``int``/``float``
    ``NUMBER_BYTES``; ``None``/``bool`` 0; ``bytes`` ``BYTES_OVERHEAD + len``. Dataclass instances
    and other objects with a ``__dict__`` are charged like dicts of their fields/attributes; any
    other object ``sys.getsizeof``. A shared sub-object is charged at each reference, and a cycle
    is walked until the ceiling (both only ever over-estimate). This is an admission estimate
    (deployment guide, "Canonical artifact retention bounds"), not a heap measurement.

    Args:
        obj: a JSON-like value (dict, list, str, int, float, bool, None), possibly containing
            tuples, bytes and dataclass instances such as parser ``Element``\\ s.
        ceiling: the byte cap, ``>= 0`` (normally the retained-artifact byte budget).

    Returns:
        ``min(estimate, ceiling)``.

    Raises:
        ValueError: a negative ceiling.
    """
    if ceiling < 0:
        raise ValueError(f"ceiling must be >= 0, got {ceiling}")
    total = 0
    stack: list[Iterator[Any]] = [iter((obj,))]
    while stack:
        try:
            item = next(stack[-1])
        except StopIteration:
            stack.pop()
            continue
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, str):
            total += _string_bytes(item, ceiling - total)
        elif isinstance(item, int | float):
            total += NUMBER_BYTES
        elif isinstance(item, dict):
            total += OBJECT_OVERHEAD + PROPERTY_OVERHEAD * len(item)
            stack.append(itertools.chain.from_iterable(item.items()))
        elif isinstance(item, list | tuple):
            total += ARRAY_OVERHEAD + ELEMENT_OVERHEAD * len(item)
            stack.append(iter(item))
        elif isinstance(item, bytes | bytearray | memoryview):
            total += BYTES_OVERHEAD + len(item)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            fields = dataclasses.fields(item)
            total += OBJECT_OVERHEAD + PROPERTY_OVERHEAD * len(fields)
            stack.append(iter([getattr(item, f.name) for f in fields]))
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            attrs = vars(item)
            total += OBJECT_OVERHEAD + PROPERTY_OVERHEAD * len(attrs)
            stack.append(iter(attrs.values()))
        else:
            total += sys.getsizeof(item)
        if total >= ceiling:
            return ceiling
    return total
