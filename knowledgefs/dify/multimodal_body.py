"""The body of a multimodal embedding request, streamed: JSON whose documents' base64 is encoded
while it is sent, so a request of ``B`` raw image bytes holds no base64 or JSON copy of them
(only the raw images the caller already holds and one small piece at a time).

:func:`streamed_body` returns a factory of fresh readers (one per attempt, as the transport
retries) and the exact size, sent as ``Content-Length``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

#: Raw bytes encoded per piece (a multiple of 3, so pieces concatenate to one valid base64).
PIECE = 3 * 64 * 1024


def _pieces(
    head: bytes, documents: Sequence[tuple[bytes, dict[str, Any]]], tail: bytes
) -> Iterator[bytes]:
    yield head
    for number, (data, extra) in enumerate(documents):
        opening = b"," if number else b""
        fields = json.dumps(extra, ensure_ascii=False, separators=(",", ":")).encode()[1:-1]
        yield opening + b'{"content":"'
        view = memoryview(data)
        for start in range(0, len(data), PIECE):
            yield base64.b64encode(view[start : start + PIECE])
        yield b'"' + (b"," + fields if fields else b"") + b"}"
    yield tail


class _Reader:
    """A read-only body of known size: ``read(n)`` for http.client, ``__len__`` and ``tell()``
    so requests sends ``Content-Length`` (not chunked)."""

    def __init__(self, pieces: Iterator[bytes], size: int) -> None:
        self._pieces = pieces
        self._pending = b""
        self._size = size
        self._sent = 0

    def __len__(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._sent

    def read(self, amount: int = -1) -> bytes:
        out = []
        wanted = amount if amount is not None and amount >= 0 else self._size
        while wanted > 0:
            if not self._pending:
                try:
                    self._pending = next(self._pieces)
                except StopIteration:
                    break
            piece, self._pending = self._pending[:wanted], self._pending[wanted:]
            out.append(piece)
            wanted -= len(piece)
        data = b"".join(out)
        self._sent += len(data)
        return data

    def __iter__(self) -> Iterator[bytes]:
        while data := self.read(PIECE):
            yield data


def streamed_body(
    common: dict[str, Any], documents: Sequence[tuple[bytes, dict[str, Any]]], input_type: str
) -> tuple[Callable[[], _Reader], int]:
    """``(factory, size)`` of ``{**common, "documents": [{"content": <base64>, **extra}],
    "input_type": input_type}`` as compact JSON; ``documents`` are ``(raw bytes, extra fields)``."""
    prefix = json.dumps(common, ensure_ascii=False, separators=(",", ":")).encode()[:-1]
    head = prefix + b',"documents":['
    tail = b'],"input_type":' + json.dumps(input_type).encode() + b"}"
    size = len(head) + len(tail)
    for number, (data, extra) in enumerate(documents):
        fields = json.dumps(extra, ensure_ascii=False, separators=(",", ":")).encode()[1:-1]
        size += (1 if number else 0) + len(b'{"content":"') + 4 * ((len(data) + 2) // 3)
        size += 1 + (1 + len(fields) if fields else 0) + 1

    def factory() -> _Reader:
        return _Reader(_pieces(head, documents, tail), size)

    return factory, size
