"""The parsing error hierarchy: :class:`ParseError` and its subclasses, each with a stable
``code`` and a client-safe ``message``.

Pure Python, no Django imports.
"""

from __future__ import annotations

from .base import SUPPORTED_MIME_TYPES


class ParseError(Exception):
    """Base of every parsing/chunking failure.

    Attributes:
        code: stable machine-readable string (e.g. ``"corrupt_document"``).
        message: human-readable explanation, safe to show to an API client.
    """

    code: str = "parse_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message


class EmptyDocument(ParseError):
    """The uploaded file has no bytes at all."""

    code = "empty_file"

    def __init__(self, message: str = "empty file") -> None:
        super().__init__(message)


class UnsupportedType(ParseError):
    """The content is of a type no parser handles; ``mime_type`` names the detected type."""

    code = "unsupported_media_type"

    def __init__(self, mime_type: str, message: str | None = None) -> None:
        self.mime_type = mime_type
        if message is None:
            supported = ", ".join(SUPPORTED_MIME_TYPES)
            message = f"unsupported media type {mime_type!r}; supported: {supported}"
        super().__init__(message)


class EncodingError(ParseError):
    """Text bytes whose encoding cannot be determined (binary or random data)."""

    code = "undetectable_encoding"

    def __init__(self, message: str = "could not determine text encoding") -> None:
        super().__init__(message)


class CorruptDocument(ParseError):
    """A damaged or unreadable file, e.g. ``"corrupt or unreadable PDF"``."""

    code = "corrupt_document"


class EncryptedDocument(ParseError):
    """A PDF that needs a user password to open."""

    code = "encrypted_document"

    def __init__(self, message: str = "encrypted PDF, password required") -> None:
        super().__init__(message)


class ContentMismatch(UnsupportedType):
    """The file name's extension names one binary format but the content is another known
    format, e.g. ``"named .pdf but the content is a PNG image"`` (code ``content_mismatch``;
    an upload answers 415). ``mime_type`` is the detected type."""

    code = "content_mismatch"


class ProtectedDocument(ParseError):
    """A document whose content is encrypted by DRM (e.g. an EPUB with
    ``META-INF/encryption.xml`` encrypting its content files); code ``drm_protected``."""

    code = "drm_protected"


class TooManyChunks(ParseError):
    """The document would produce more chunks than the per-document cap."""

    code = "too_many_chunks"
