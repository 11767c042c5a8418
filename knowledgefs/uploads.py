"""Multipart uploads that keep the client's filename verbatim and stop at the size limit.

Django normally rewrites an uploaded file's name (drops directories, unescapes HTML entities,
removes non-printable characters, truncates to 255) and refuses names such as ``..``. KnowledgeFS
never uses the name for storage (keys come from ids), so the original is kept as ``raw_name`` on
the uploaded file for display and citations; Django's own objects get a fixed placeholder name.
Bytes beyond ``KNOWLEDGE_UPLOAD_MAX_BYTES`` abort the read with a 413 before they are kept.

A multipart body must end with its closing delimiter (``--boundary--``, RFC 2046 5.1.1). Django's
parser accepts a body cut short of it (the request is read only up to its Content-Length, so a
Content-Length smaller than the body sent cuts it) and then reports no file at all; here that is
400 ``malformed_request`` naming the declared length, not a misleading "field 'file' is
required".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

import django.http.multipartparser as django_multipart
from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import (
    FileUploadHandler,
    MemoryFileUploadHandler,
    TemporaryFileUploadHandler,
)
from django.http.multipartparser import MultiPartParser as DjangoMultiPartParser
from django.http.multipartparser import MultiPartParserError
from django.utils.datastructures import MultiValueDict
from django.utils.http import parse_header_parameters
from rest_framework.exceptions import ParseError
from rest_framework.parsers import DataAndFiles, MultiPartParser

from .errors import InvalidInput, PayloadTooLarge


def require_multipart(content_type: str | None) -> None:
    """400 ``multipart_required`` unless the request's media type is ``multipart/form-data``
    (a JSON or form body sent to an upload route is named as such, not reported as a
    missing file or a bad filename)."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "multipart/form-data":
        sent = media_type or "no Content-Type"
        raise InvalidInput(
            f"an upload needs a multipart/form-data body with the file in the field 'file', "
            f"not {sent}",
            code="multipart_required",
            details={"content_type": media_type or None},
        )


def upload_limit_message(limit: int) -> str:
    """The 413 text for ``KNOWLEDGE_UPLOAD_MAX_BYTES`` = ``limit`` bytes, e.g. "file exceeds the
    upload limit of 15728640 bytes (15 MiB)" — the one place the limit is put into words."""
    return f"file exceeds the upload limit of {limit} bytes ({limit / 1048576:g} MiB)"


# Django caps one part's headers at 1 KiB, which a 512-character CJK filename (about 1.5 KiB of
# UTF-8) exceeds; 8 KiB keeps the cap while letting every filename within our own limit through.
# (django-stubs does not declare this module constant of Django 5.2's multipartparser.)
django_multipart.MAX_TOTAL_HEADER_SIZE = max(  # type: ignore[attr-defined]
    django_multipart.MAX_TOTAL_HEADER_SIZE,  # type: ignore[attr-defined]
    8 * 1024,
)


class _RawNameMixin(FileUploadHandler):
    """Put before a Django upload handler class (its methods are reached through ``super()``)."""

    raw_file_name: str
    received_bytes: int

    def new_file(self, field_name: str, file_name: str, *args: Any, **kwargs: Any) -> None:
        self.raw_file_name = file_name
        self.received_bytes = 0
        super().new_file(field_name, "upload", *args, **kwargs)

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received_bytes += len(raw_data)
        limit: int = settings.KNOWLEDGE_UPLOAD_MAX_BYTES
        if self.received_bytes > limit:
            part = getattr(self, "file", None)
            if part is not None:
                part.close()  # a temporary file is deleted on close: no partial file remains
            raise PayloadTooLarge(upload_limit_message(limit), details={"limit_bytes": limit})
        return super().receive_data_chunk(raw_data, start)

    def file_complete(self, file_size: int) -> UploadedFile[Any] | None:
        uploaded = super().file_complete(file_size)
        if uploaded is not None:
            # An attribute of our own, read back with getattr(upload, "raw_name", upload.name).
            setattr(uploaded, "raw_name", self.raw_file_name)  # noqa: B010
        return uploaded


class RawNameMemoryUploadHandler(_RawNameMixin, MemoryFileUploadHandler):
    """Small files in memory, keeping the raw filename."""


class RawNameTemporaryUploadHandler(_RawNameMixin, TemporaryFileUploadHandler):
    """Larger files spooled to a temporary file, keeping the raw filename."""


class _VerbatimNameParser(DjangoMultiPartParser):
    def sanitize_file_name(self, file_name: str) -> str | None:
        # Browsers and HTTP libraries percent-encode exactly these three characters in a
        # multipart filename (WHATWG HTML, "multipart/form-data encoding algorithm").
        if file_name:
            file_name = file_name.replace("%22", '"').replace("%0D", "\r").replace("%0A", "\n")
        return file_name or None


class _ClosingDelimiterWatch:
    """A body stream that notes whether the multipart closing delimiter went through it."""

    def __init__(self, stream: IO[Any], boundary: bytes) -> None:
        self._stream = stream
        self._delimiter = b"--" + boundary + b"--"
        self._tail = b""
        self.read_bytes = 0
        self.closed = False

    def read(self, *args: Any) -> bytes:
        data: bytes = self._stream.read(*args)
        self.read_bytes += len(data)
        if data and not self.closed:
            window = self._tail + data
            self.closed = self._delimiter in window
            self._tail = window[-(len(self._delimiter) - 1) :]
        return data


class VerbatimMultiPartParser(MultiPartParser):
    """DRF multipart parser that leaves file names untouched and refuses a body without its
    closing delimiter (see module docstring); errors are DRF ``ParseError`` (400
    ``malformed_request``)."""

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> DataAndFiles[Any, Any]:
        parser_context = parser_context or {}
        request = parser_context["request"]
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        meta = request.META.copy()
        meta["CONTENT_TYPE"] = media_type
        try:
            watch = _ClosingDelimiterWatch(stream, _boundary(media_type))
            # Django reads the body only through read() (ChunkIter); the stub's protocol also
            # asks for readline(), readlines() and iteration.
            parser = _VerbatimNameParser(
                meta,
                watch,  # type: ignore[arg-type]
                request.upload_handlers,
                encoding,
            )
            data, files = parser.parse()
        except MultiPartParserError as exc:
            raise ParseError(f"multipart form parse error: {exc}") from exc
        if watch.read_bytes and not watch.closed:
            _close_parts(files)
            raise ParseError(
                f"the multipart body ended after its declared Content-Length of "
                f"{watch.read_bytes} bytes without its closing boundary: the body is incomplete "
                "or malformed, or its Content-Length is smaller than the body sent; nothing is "
                "stored"
            )
        return DataAndFiles(data, files)


def _boundary(media_type: str | None) -> bytes:
    """The ``boundary`` parameter of a multipart Content-Type (Django validates it again)."""
    _, params = parse_header_parameters(media_type or "")
    return params.get("boundary", "").encode("ascii", "ignore")


def _close_parts(files: MultiValueDict[str, UploadedFile[Any]] | None) -> None:
    """Close (and so delete, for temporary files) the parts of a refused body."""
    for _, parts in files.lists() if files else ():
        for part in parts:
            try:
                part.close()
            except OSError:
                pass
