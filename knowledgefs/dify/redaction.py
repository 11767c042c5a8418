"""Messages from Dify made safe to keep in an error or a log.

:func:`sanitize_message` removes secrets and echoes of the request's own texts, control
characters, and cuts the rest; it looks at no more than :data:`MESSAGE_SCAN_CHARS` characters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_REDACT = [
    re.compile(r"(?i)\bbearer\s+\S+"),
    re.compile(
        r"(?i)\b(api[_-]?key|access[_-]?token|refresh[_-]?token|secret|password|passwd|"
        r"authorization|credentials?|token)\b\s*[:=]\s*(\"[^\"]*\"|'[^']*'|[^\s,;]+)"
    ),
    re.compile(r"\b(sk|pk|rk|ghp|gho|xox[abpr]|AKIA)[-_A-Za-z0-9]{8,}"),
    re.compile(r"://[^/\s:@]+:[^/\s@]*@"),
    re.compile(r"[A-Za-z0-9+/=_-]{32,}"),
]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
MESSAGE_MAX_CHARS = 240
#: Only this much of a message from Dify is looked at (the rest could never be shown).
MESSAGE_SCAN_CHARS = 2000
#: Any span of the message this long that occurs in one of the inputs is an echo of it.
INPUT_SPAN_CHARS = 20


def _redact_input_spans(text: str, inputs: Sequence[str]) -> str:
    """Replace every run of ``text`` covered by a span of :data:`INPUT_SPAN_CHARS` characters
    that occurs anywhere in an input by ``[input]`` (cost: one pass over each input)."""
    width = INPUT_SPAN_CHARS
    if len(text) < width:
        return text
    windows: dict[str, list[int]] = {}
    for i in range(len(text) - width + 1):
        windows.setdefault(text[i : i + width], []).append(i)
    covered = bytearray(len(text))
    found = 0
    for value in inputs:
        if not isinstance(value, str) or len(value) < width:
            continue
        for j in range(len(value) - width + 1):
            positions = windows.pop(value[j : j + width], None)
            if positions:
                found += 1
                for i in positions:
                    covered[i : i + width] = b"\x01" * width
        if not windows:
            break
    if not found:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        if covered[i]:
            while i < len(text) and covered[i]:
                i += 1
            out.append("[input]")
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def sanitize_message(text: str, *, secrets: Sequence[str] = (), inputs: Sequence[str] = ()) -> str:
    """A message from Dify made safe to keep in an error: secrets (the inner key, credentials,
    bearer tokens, ``key=value`` secrets, long opaque tokens) become ``[redacted]``, any echo
    of the request's own texts (a whole text of 12 characters or more, or any part of one of
    20 characters or more, wherever it starts) becomes ``[input]``, control characters become
    spaces, and the result is cut at 240 characters."""
    if len(text) > MESSAGE_SCAN_CHARS:
        # Cut before looking; the last span's worth is dropped too, so that an echo cut by
        # the limit cannot slip through as a piece shorter than a span.
        text = text[: MESSAGE_SCAN_CHARS - INPUT_SPAN_CHARS] + "…"
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    for value in inputs:
        if isinstance(value, str) and len(value) >= 12:
            text = text.replace(value, "[input]")
    text = _redact_input_spans(text, inputs)
    for pattern in _REDACT:
        text = pattern.sub("[redacted]", text)
    text = _CONTROL.sub(" ", text).strip()
    if len(text) > MESSAGE_MAX_CHARS:
        text = text[: MESSAGE_MAX_CHARS - 1] + "…"
    return text
