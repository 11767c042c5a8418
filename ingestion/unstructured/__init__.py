"""The Unstructured-compatible remote parser: client, limits, element mapping, local endpoint.

Public API (used by compilation):

* :func:`enabled` - whether ``UNSTRUCTURED_API_URL`` is set;
* :func:`routes` - whether a MIME type goes to the remote parser when enabled;
* :func:`parse_remote` - parse one document remotely into a
  :class:`~ingestion.parsing.ParseReport` (``parser="unstructured"``), raising
  :class:`~ingestion.parsing.ParseError` subclasses with stable codes
  (:mod:`ingestion.unstructured.errors`).

Imports are lazy so that the local endpoint (:mod:`ingestion.unstructured.server`) runs in the
separate ``.venv-unstructured`` without Django. See docs/unstructured.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ingestion.parsing.base import ParseReport

__all__ = ["enabled", "parse_remote", "routes"]


def enabled() -> bool:
    """Whether the remote parser is configured (``UNSTRUCTURED_API_URL`` is set)."""
    from django.conf import settings

    return bool(getattr(settings, "UNSTRUCTURED_API_URL", ""))


def routes(mime_type: str) -> bool:
    """Whether ``mime_type`` is a complex format sent to the remote parser when
    :func:`enabled`: PDF, DOCX, PPTX, XLSX, EPUB, ODT, legacy Office, RTF, EML, MSG. TXT,
    Markdown, CSV, HTML and images stay native."""
    from .limits import routes as _routes

    return _routes(mime_type)


def parse_remote(data: bytes, mime_type: str, filename: str) -> ParseReport:
    """Parse ``data`` remotely; see :func:`ingestion.unstructured.client.parse_remote` for the
    limits applied and the errors raised."""
    from .client import parse_remote as _parse_remote

    return _parse_remote(data, mime_type, filename)


def __getattr__(name: str) -> Any:
    # Error classes, e.g. ``ingestion.unstructured.ParserTimeout``, imported on first use.
    if name.startswith("Parser") or name == "UnstructuredError":
        errors = importlib.import_module(f"{__name__}.errors")
        if hasattr(errors, name):
            return getattr(errors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
