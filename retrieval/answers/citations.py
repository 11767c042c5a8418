"""Citation normalisation of a streamed answer (the rules are in :mod:`retrieval.answers`)."""

from __future__ import annotations

import re

_MARKER = re.compile(r"\[E(\d{1,6})\]")
_PARTIAL_MARKER = re.compile(r"\[(?:E\d{0,6})?$")
_UNFINISHED_MARKER = re.compile(r"\s*(\[E\d{0,6})$")


class CitationNormaliser:
    """Normalise a streamed answer's markers; see the module docstring.

    :meth:`feed` takes the model's next text and returns what may be sent now (a possibly
    unfinished marker at the end, and trailing whitespace, are held back); :meth:`flush` returns
    the rest. ``cited`` lists the markers kept (first use first), ``orphans`` the removed ones,
    ``truncated`` says the answer hit ``max_bytes``.
    """

    def __init__(self, valid: set[str], max_bytes: int) -> None:
        self.valid = valid
        self.max_bytes = max_bytes
        self.pending = ""
        self.space = ""
        self.last_marker: str | None = None
        self.cited: list[str] = []
        self.orphans: list[str] = []
        self.parts: list[str] = []
        self.size = 0
        self.truncated = False

    @property
    def answer(self) -> str:
        return "".join(self.parts)

    def feed(self, text: str) -> str:
        self.pending += text
        held = _PARTIAL_MARKER.search(self.pending)
        cut = held.start() if held else len(self.pending)
        chunk, self.pending = self.pending[:cut], self.pending[cut:]
        return self._process(chunk)

    def flush(self) -> str:
        chunk, self.pending = self.pending, ""
        unfinished = _UNFINISHED_MARKER.search(chunk)
        if unfinished:  # the stream ended inside a marker ("… [E1"): never shown half-rendered
            if unfinished.group(1) not in self.orphans:
                self.orphans.append(unfinished.group(1))
            chunk = chunk[: unfinished.start()]
        out = self._process(chunk)
        self.space = ""  # trailing whitespace of the answer is dropped
        return out

    def _process(self, chunk: str) -> str:
        out: list[str] = []
        position = 0
        for match in _MARKER.finditer(chunk):
            self._text(chunk[position : match.start()], out)
            self._marker(f"[E{int(match.group(1))}]", out)
            position = match.end()
        self._text(chunk[position:], out)
        return "".join(out)

    def _text(self, text: str, out: list[str]) -> None:
        if not text:
            return
        body = text.rstrip()
        if not body:
            self.space += text
            return
        self._emit(self.space + body, out)
        self.space = text[len(body) :]
        self.last_marker = None

    def _marker(self, label: str, out: list[str]) -> None:
        if label not in self.valid:
            if label not in self.orphans:
                self.orphans.append(label)
            self.space = ""
            return
        if label == self.last_marker:  # "[E1] [E1]" → "[E1]"
            self.space = ""
            return
        if self._emit(self.space + label, out, whole=True):
            self.space = ""
            self.last_marker = label
            if label not in self.cited:
                self.cited.append(label)

    def _emit(self, text: str, out: list[str], whole: bool = False) -> bool:
        if self.truncated:
            return False
        data = text.encode()
        room = self.max_bytes - self.size
        if len(data) > room:
            self.truncated = True
            if whole:
                return False
            text = data[:room].decode(errors="ignore")
            data = text.encode()
        self.size += len(data)
        if text:
            self.parts.append(text)
            out.append(text)
        return True
