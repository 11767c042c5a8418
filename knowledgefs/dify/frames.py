"""Dify's length-prefixed binary frames (the stream format of LLM and datasource answers).

Each frame: byte 0 magic ``0x0f``, byte 1 reserved, bytes 2-3 header length (uint16 LE, at least
10), bytes 4-7 data length (uint32 LE), the rest of the header, then the JSON payload.
:class:`FrameDecoder` decodes incrementally, never buffering past ``max_frame_bytes`` per frame;
:func:`iter_frames` yields each payload's JSON value as its bytes arrive.
"""

from __future__ import annotations

import struct
from collections.abc import Generator
from typing import Any

from .envelope import parse_json
from .errors import DifyError
from .stream import ResponseStream

FRAME_MAGIC = 0x0F
FRAME_PREFIX_BYTES = 4  # magic (1), reserved (1), header length (uint16 LE)
FRAME_MIN_HEADER_BYTES = 10  # data length (uint32 LE) + 6 reserved bytes
_PREFIX = struct.Struct("<BBH")
_DATA_LENGTH = struct.Struct("<I")


def encode_frame(payload: bytes) -> bytes:
    """One frame as Dify writes it: ``0x0f``, 0, header length 10, data length, 6 zero bytes,
    payload (all little endian)."""
    return (
        _PREFIX.pack(FRAME_MAGIC, 0, FRAME_MIN_HEADER_BYTES)
        + _DATA_LENGTH.pack(len(payload))
        + bytes(6)
        + payload
    )


class FrameDecoder:
    """Incremental decoder of Dify's length-prefixed frames.

    Layout: byte 0 magic ``0x0f``, byte 1 reserved, bytes 2-3 header length ``h`` (uint16 LE,
    at least 10), bytes 4-7 data length ``n`` (uint32 LE), then the rest of the header up to
    byte ``4 + h``, then ``n`` bytes of JSON. :meth:`feed` returns the payloads completed by
    the bytes given; a bad magic or header length is ``invalid``, a frame declaring more than
    ``max_frame_bytes`` is ``too_large`` before its payload is read, and :meth:`finish` makes a
    stream that ended inside a frame ``invalid``.
    """

    def __init__(self, *, errors: type[DifyError], route: str, max_frame_bytes: int) -> None:
        self._errors = errors
        self._route = route
        self._max = max_frame_bytes
        self._buffer = bytearray()
        self.frames = 0

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        payloads: list[bytes] = []
        while self._buffer:
            if self._buffer[0] != FRAME_MAGIC:
                raise self._errors.of(
                    "invalid",
                    f"{self._route}: frame {self.frames} starts with 0x{self._buffer[0]:02x}, "
                    "not the magic 0x0f",
                    route=self._route,
                )
            if len(self._buffer) < FRAME_PREFIX_BYTES + 4:
                break
            _, _, header = _PREFIX.unpack_from(self._buffer, 0)
            (length,) = _DATA_LENGTH.unpack_from(self._buffer, FRAME_PREFIX_BYTES)
            if header < FRAME_MIN_HEADER_BYTES:
                raise self._errors.of(
                    "invalid",
                    f"{self._route}: frame {self.frames} has a header of {header} bytes",
                    route=self._route,
                )
            start = FRAME_PREFIX_BYTES + header
            if start + length > self._max:
                raise self._errors.of(
                    "too_large",
                    f"{self._route}: frame {self.frames} declares {start + length} bytes, "
                    f"over the limit of {self._max}",
                    route=self._route,
                )
            if len(self._buffer) < start + length:
                break
            payloads.append(bytes(self._buffer[start : start + length]))
            del self._buffer[: start + length]
            self.frames += 1
        return payloads

    def finish(self) -> None:
        if self._buffer:
            raise self._errors.of(
                "invalid",
                f"{self._route}: the stream ended inside frame {self.frames} "
                f"({len(self._buffer)} bytes of it)",
                route=self._route,
            )


def iter_frames(
    stream: ResponseStream, *, errors: type[DifyError], route: str
) -> Generator[Any, None, None]:
    """Parse frames as their bytes arrive and yield each payload's JSON value.

    The stream's own cap bounds the total; each frame is bounded by the same cap. The stream is
    closed when the iteration ends, fails or is abandoned.
    """
    decoder = FrameDecoder(errors=errors, route=route, max_frame_bytes=stream._max_bytes)
    try:
        for chunk in stream:
            for payload in decoder.feed(chunk):
                yield parse_json(payload, errors=errors, route=route)
        decoder.finish()
    finally:
        stream.close()
