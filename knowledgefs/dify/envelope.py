"""JSON answers of Dify's inner API and its ``{data, error}`` envelope.

:func:`parse_json` parses a body already read under its cap; :func:`unwrap_envelope` returns the
envelope's ``data`` or raises the surface's typed error, Dify's message passed through
:func:`~knowledgefs.dify.redaction.sanitize_message`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .errors import DifyError
from .redaction import sanitize_message


def parse_json(body: bytes, *, errors: type[DifyError], route: str) -> Any:
    """Parse a body already read under its cap; ``invalid`` when it is not JSON."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise errors.of(
            "invalid", f"{route}: the answer is not JSON ({len(body)} bytes)", route=route
        ) from None


def unwrap_envelope(
    value: Any,
    *,
    errors: type[DifyError],
    route: str,
    secrets: Sequence[str] = (),
    inputs: Sequence[str] = (),
) -> Any:
    """Return ``data`` of Dify's ``{data, error}`` envelope.

    A non-empty string ``error`` raises the surface's ``error`` kind (``MODEL_RUNTIME_ERROR``,
    ``DATASOURCE_ERROR``; not retryable) with Dify's message passed through
    :func:`sanitize_message`, and so does a ``data`` of ``null`` next to an ``error`` of ``""``.
    Anything else that is not an object holding ``data`` and a string or null ``error`` (``{}``,
    ``{"error": null, "message": "Not Found"}``, a null ``data`` with a null ``error``) is
    ``invalid``: it is not an envelope, so it proves nothing about the route.
    """
    if not isinstance(value, dict):
        raise errors.of(
            "invalid", f"{route}: the answer is not a {{data, error}} envelope", route=route
        )
    message = value.get("error")
    if message is not None and not isinstance(message, str):
        raise errors.of("invalid", f"{route}: the envelope's error is not a string", route=route)
    if message:
        safe = sanitize_message(message, secrets=secrets, inputs=inputs)
        raise errors.of("error", f"{route}: Dify reported: {safe}", route=route)
    if "data" not in value or "error" not in value:
        raise errors.of(
            "invalid",
            f"{route}: the answer is not a {{data, error}} envelope (no data, no error)",
            route=route,
        )
    data = value["data"]
    if data is None:
        if message is None:
            raise errors.of(
                "invalid", f"{route}: the envelope holds a null data and a null error", route=route
            )
        raise errors.of("error", f"{route}: Dify answered no data and no error", route=route)
    return data
