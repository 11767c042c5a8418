"""Object storage in Dify's configured storage, through Dify's inner storage API.

Routes under ``/inner/api/knowledge-fs/storage``: ``PUT|GET|DELETE /object?key=``,
``GET /object/metadata?key=``, ``GET /objects?prefix=&cursor=&limit=`` (keys in lexical order,
``nextCursor`` until the last page), ``GET /health``. A PUT carries the body's SHA-256
(``X-Knowledge-FS-Checksum-Sha256``, base64), string metadata (``X-Knowledge-FS-Metadata``,
base64url JSON) and a content type (``X-Knowledge-FS-Content-Type``); Dify answers 422 when the
body does not match its checksum and 413 over its size limit (64 MiB). A GET streams the body with
``Content-Length`` and the stored checksum, which is verified when the stream ends.

:class:`DifyObjectStorage` is a Django ``Storage``: ``storages["objects"]`` can be pointed at it
(``"BACKEND": "knowledgefs.dify.object_storage.DifyObjectStorage"``) and
``knowledgefs.storage.put_object`` / ``read_object`` work unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, NoReturn

from django.conf import settings
from django.core.exceptions import SuspiciousFileOperation
from django.core.files.base import File
from django.core.files.storage import Storage
from django.utils.deconstruct import deconstructible

from . import config
from .envelope import parse_json
from .errors import DifyError, ObjectStorageError
from .stream import CHUNK_BYTES, ResponseStream
from .transport import DifyTransport

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

    _BytesFile = File[bytes]
else:  # File is generic in the stubs only (no runtime __class_getitem__)
    _BytesFile = File

OBJECT = "/inner/api/knowledge-fs/storage/object"
OBJECT_METADATA = "/inner/api/knowledge-fs/storage/object/metadata"
OBJECTS = "/inner/api/knowledge-fs/storage/objects"
HEALTH = "/inner/api/knowledge-fs/storage/health"

CHECKSUM_HEADER = "X-Knowledge-FS-Checksum-Sha256"
METADATA_HEADER = "X-Knowledge-FS-Metadata"
CONTENT_TYPE_HEADER = "X-Knowledge-FS-Content-Type"

#: ``listdir`` reads the whole listing under a prefix; past this many objects it refuses.
LISTDIR_MAX_OBJECTS = 100_000


def validate_key(key: Any) -> str:
    """Return ``key`` unchanged if Dify accepts it, else raise ``SuspiciousFileOperation``.

    A key is 1..1024 UTF-8 bytes, relative, without backslashes, NUL, surrounding spaces, or
    empty, ``.`` or ``..`` segments (Dify would strip spaces, which would rename the object).
    """
    if not isinstance(key, str) or not key:
        raise SuspiciousFileOperation("an object key must be a non-empty string")
    if (
        key != key.strip()
        or key.startswith("/")
        or "\\" in key
        or "\x00" in key
        or any(segment in ("", ".", "..") for segment in key.split("/"))
        or len(key.encode()) > config.OBJECT_KEY_MAX_BYTES
    ):
        raise SuspiciousFileOperation(
            f"object key {key[:80]!r} is not accepted: relative, no empty, '.' or '..' "
            "segments, no backslash or NUL, no surrounding spaces, at most 1024 UTF-8 bytes"
        )
    return key


def _validate_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    if len(metadata) > config.OBJECT_METADATA_MAX_ENTRIES:
        raise ObjectStorageError.of("input", "object metadata holds more than 64 entries")
    for name, value in metadata.items():
        if (
            not isinstance(name, str)
            or not isinstance(value, str)
            or not name
            or len(name.encode()) > config.OBJECT_METADATA_KEY_MAX_BYTES
            or len(value.encode()) > config.OBJECT_METADATA_VALUE_MAX_BYTES
        ):
            raise ObjectStorageError.of(
                "input", "object metadata must map names of 1..64 bytes to strings of ≤ 1 KiB"
            )
    return dict(metadata)


@dataclass(frozen=True)
class ObjectInfo:
    """What Dify knows about an object: size in bytes, SHA-256 (base64), content type, metadata."""

    key: str
    size_bytes: int
    checksum_sha256_base64: str | None
    content_type: str | None
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ObjectPage:
    """One listing page (lexical key order); ``next_cursor`` is ``None`` on the last page."""

    objects: list[ObjectInfo]
    next_cursor: str | None


def _object_info(value: Any, route: str) -> ObjectInfo:
    if not isinstance(value, dict):
        raise ObjectStorageError.of("invalid", f"{route}: metadata is not an object")
    key, size = value.get("key"), value.get("sizeBytes")
    metadata = value.get("metadata", {})
    checksum, content_type = value.get("checksumSha256Base64"), value.get("contentType")
    if (
        not isinstance(key, str)
        or not key
        or isinstance(size, bool)
        or not isinstance(size, int)
        or size < 0
        or not isinstance(metadata, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        or not isinstance(checksum, str | None)
        or not isinstance(content_type, str | None)
    ):
        raise ObjectStorageError.of("invalid", f"{route}: metadata is malformed")
    return ObjectInfo(
        key=key,
        size_bytes=size,
        checksum_sha256_base64=checksum or None,
        content_type=content_type or None,
        metadata=metadata,
    )


class _ObjectReader(io.RawIOBase):
    """Raw reader over a GET stream: hashes what passes and checks the checksum at the end."""

    def __init__(self, stream: ResponseStream, key: str, limit: int) -> None:
        super().__init__()
        self._stream = stream
        self._key = key
        self._limit = limit
        self._expected = stream.headers.get(CHECKSUM_HEADER)
        self._hash = hashlib.sha256()
        self._pending = b""
        self._done = False
        self._verified = False

    @property
    def bytes_received(self) -> int:
        return self._stream.bytes_read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        buffer = memoryview(buffer)  # what BufferedReader hands in; writes go to its memory
        if self._done:
            return 0
        if not self._pending:
            try:
                self._pending = self._stream.read(max(len(buffer), CHUNK_BYTES))
            except ObjectStorageError as exc:
                if exc.code == ObjectStorageError.CODES["too_large"]:
                    exc.message = (
                        f"object {self._key[:80]!r} is larger than {self._limit} bytes "
                        f"(stopped after reading {exc.bytes_read})"
                    )
                raise
            if not self._pending:
                self._done = True
                self._verify()
                return 0
            self._hash.update(self._pending)
            if self._stream.bytes_read == self._stream.content_length:
                self._verify()  # every declared byte is here: verify before handing them out
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _verify(self) -> None:
        if self._verified:
            return
        self._verified = True
        actual = base64.b64encode(self._hash.digest()).decode()
        if actual != self._expected:
            raise ObjectStorageError.of(
                "checksum",
                f"object {self._key[:80]!r}: the bytes read do not match the stored SHA-256",
                route=OBJECT,
                bytes_read=self._stream.bytes_read,
            )

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


class DifyObjectFile(_BytesFile):
    """A read-only object opened from Dify: reads stream from the response (nothing is buffered
    beyond one 64 KiB piece), stop at the byte limit with ``STORAGE_OBJECT_TOO_LARGE``, and
    verify the SHA-256 when the end is reached (``STORAGE_CHECKSUM_MISMATCH``). ``size`` is the
    stored size; ``bytes_received`` counts the bytes taken from the network."""

    def __init__(self, reader: _ObjectReader, name: str, size: int | None) -> None:
        super().__init__(io.BufferedReader(reader, buffer_size=CHUNK_BYTES), name=name)
        self._reader = reader
        self._known_size = size
        self.mode = "rb"

    @property
    def size(self) -> int | None:  # type: ignore[override]
        return self._known_size

    @property
    def bytes_received(self) -> int:
        return self._reader.bytes_received

    def open(  # Django File.open signature
        self,
        mode: str | None = None,
        buffering: int = -1,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
        closefd: bool = True,
        opener: Callable[[str, int], int] | None = None,
    ) -> NoReturn:
        raise ValueError("a Dify object cannot be reopened; open it from the storage again")


class Health:
    """Result of :meth:`DifyObjectStorage.health`: truthy when storage is usable; ``detail``
    says why not."""

    def __init__(self, ok: bool, detail: str) -> None:
        self.ok, self.detail = ok, detail

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return f"Health(ok={self.ok}, detail={self.detail!r})"


@deconstructible(path="knowledgefs.dify.object_storage.DifyObjectStorage")
class DifyObjectStorage(Storage):
    """Django storage over Dify's inner storage API; names are object keys, kept exactly.

    ``timeout_ms`` defaults to ``DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS`` (60 000) and bounds
    each call, body included (a file opened with :meth:`open` must be read within it).
    ``max_object_bytes`` (64 MiB, Dify's limit) refuses larger bodies before sending and stops
    reads past it. GET, DELETE, metadata, listing and PUT (which always carries a checksum) are
    retried inline on connection failures and 408/409/425/429/5xx.

    Errors are :class:`~knowledgefs.dify.errors.ObjectStorageError` (an ``OSError``; codes
    ``STORAGE_*``); a missing object on ``open`` or ``size`` is ``StorageNotFound`` (a
    ``FileNotFoundError``); a key Dify would refuse is ``SuspiciousFileOperation``.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_ms: int | None = None,
        max_object_bytes: int = config.OBJECT_MAX_BYTES,
        transport: DifyTransport | None = None,
    ) -> None:
        self.transport = transport or DifyTransport(base_url, api_key)
        self.timeout_ms: int = timeout_ms or int(
            getattr(
                settings,
                "DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS",
                config.OBJECT_STORAGE_TIMEOUT_MS,
            )
        )
        self.max_object_bytes = max_object_bytes

    @property
    def _timeout(self) -> float:
        return self.timeout_ms / 1000

    # -- writing -------------------------------------------------------------------------------

    def get_available_name(self, name: str, max_length: int | None = None) -> str:
        """The caller's key, unchanged: objects are never renamed (a save replaces)."""
        key = validate_key(name)
        if max_length is not None and len(key) > max_length:
            raise SuspiciousFileOperation(f"object key is longer than {max_length} characters")
        return key

    def _save(self, name: str, content: File[bytes]) -> str:
        return self.save_object(
            name, content, content_type=getattr(content, "content_type", None)
        ).key

    def save_object(
        self,
        key: str,
        content: File[bytes] | bytes,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        """PUT ``content`` under exactly ``key`` with its SHA-256, ``metadata`` (string map) and
        ``content_type``; returns what Dify stored. The body is streamed from the file (read
        twice: once to hash, once to send; a non-seekable one is spooled to a temporary file).
        Raises ``STORAGE_OBJECT_TOO_LARGE`` over ``max_object_bytes`` without sending,
        ``STORAGE_CHECKSUM_MISMATCH`` when Dify saw other bytes."""
        key = validate_key(key)
        encoded_metadata = base64.urlsafe_b64encode(
            json.dumps(_validate_metadata(metadata or {}), separators=(",", ":")).encode()
        ).decode()
        source = _seekable(content, self.max_object_bytes)
        try:
            digest, size = hashlib.sha256(), 0
            source.seek(0)
            while chunk := source.read(CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
                if size > self.max_object_bytes:
                    raise ObjectStorageError.of(
                        "too_large",
                        f"object {key[:80]!r} is larger than {self.max_object_bytes} bytes",
                        route=OBJECT,
                    )
            checksum = base64.b64encode(digest.digest()).decode()
            headers = {
                CHECKSUM_HEADER: checksum,
                METADATA_HEADER: encoded_metadata,
                "Content-Type": "application/octet-stream",
            }
            if content_type:
                headers[CONTENT_TYPE_HEADER] = content_type

            def body() -> _Body:
                source.seek(0)
                return _Body(source, size)

            reply = self.transport.request(
                "PUT",
                OBJECT,
                errors=ObjectStorageError,
                timeout=self._timeout,
                max_bytes=config.OBJECT_METADATA_RESPONSE_MAX_BYTES,
                idempotent=True,
                params={"key": key},
                body=body,
                body_size=size,
                headers=headers,
                expect=(200, 201),
            )
        finally:
            if source is not content:
                source.close()
        info = _object_info(parse_json(reply.body, errors=ObjectStorageError, route=OBJECT), OBJECT)
        if info.key != key or info.size_bytes != size:
            raise ObjectStorageError.of(
                "invalid", f"{OBJECT}: Dify stored {info.key[:80]!r} of {info.size_bytes} bytes"
            )
        if info.checksum_sha256_base64 not in (None, checksum):
            raise ObjectStorageError.of(
                "checksum", f"object {key[:80]!r}: Dify stored a different SHA-256"
            )
        return info

    # -- reading -------------------------------------------------------------------------------

    def _open(self, name: str, mode: str = "rb") -> DifyObjectFile:
        if any(flag in mode for flag in "wax+"):
            raise ValueError(f"Dify objects open read-only, not with mode {mode!r}")
        return self.open_object(name)

    def open_object(self, key: str, *, max_bytes: int | None = None) -> DifyObjectFile:
        """GET ``key`` as a streamed read-only file.

        ``max_bytes`` (default ``max_object_bytes``) is a hard limit: a larger declared size is
        refused before reading, and reading past it raises ``STORAGE_OBJECT_TOO_LARGE``.
        Missing: ``StorageNotFound``. The connection is released when the file is closed.
        """
        key = validate_key(key)
        limit = min(max_bytes or self.max_object_bytes, self.max_object_bytes)
        try:
            stream = self.transport.open_stream(
                "GET",
                OBJECT,
                errors=ObjectStorageError,
                timeout=self._timeout,
                max_bytes=limit,
                retry_until_body=True,
                params={"key": key},
                passthrough=(404,),
            )
        except ObjectStorageError as exc:
            if exc.code == ObjectStorageError.CODES["too_large"]:
                exc.message = f"object {key[:80]!r} is larger than {limit} bytes"
            raise
        if stream.status == 404:
            stream.close()
            raise ObjectStorageError.of(
                "not_found", f"no object {key[:80]!r}", status=404, route=OBJECT
            )
        if not stream.headers.get(CHECKSUM_HEADER):
            stream.close()
            raise ObjectStorageError.of(
                "invalid", f"{OBJECT}: the answer carries no {CHECKSUM_HEADER}", route=OBJECT
            )
        return DifyObjectFile(_ObjectReader(stream, key, limit), key, stream.content_length)

    def metadata(self, key: str) -> ObjectInfo | None:
        """Dify's metadata of ``key``, or ``None`` when there is no such object."""
        key = validate_key(key)
        reply = self.transport.request(
            "GET",
            OBJECT_METADATA,
            errors=ObjectStorageError,
            timeout=self._timeout,
            max_bytes=config.OBJECT_METADATA_RESPONSE_MAX_BYTES,
            idempotent=True,
            params={"key": key},
            passthrough=(404,),
        )
        if reply.status == 404:
            return None
        return _object_info(
            parse_json(reply.body, errors=ObjectStorageError, route=OBJECT_METADATA),
            OBJECT_METADATA,
        )

    def exists(self, name: str) -> bool:
        return self.metadata(name) is not None

    def size(self, name: str) -> int:
        info = self.metadata(name)
        if info is None:
            raise ObjectStorageError.of("not_found", f"no object {name[:80]!r}", status=404)
        return info.size_bytes

    def delete(self, name: str) -> None:
        """DELETE ``name``; a missing object is not an error (204 and 404 both succeed)."""
        self.transport.request(
            "DELETE",
            OBJECT,
            errors=ObjectStorageError,
            timeout=self._timeout,
            max_bytes=config.OBJECT_METADATA_RESPONSE_MAX_BYTES,
            idempotent=True,
            params={"key": validate_key(name)},
            expect=(200, 204),
            passthrough=(404,),
        )

    # -- listing -------------------------------------------------------------------------------

    def list_objects(
        self, prefix: str = "", *, cursor: str | None = None, limit: int = 100
    ) -> ObjectPage:
        """One page of objects whose key starts with ``prefix``, after ``cursor``."""
        if not 1 <= limit <= config.OBJECT_LIST_MAX_LIMIT:
            raise ObjectStorageError.of("input", "listing limit must be between 1 and 100")
        params = {"prefix": prefix, "limit": str(limit)}
        if cursor:
            params["cursor"] = cursor
        reply = self.transport.request(
            "GET",
            OBJECTS,
            errors=ObjectStorageError,
            timeout=self._timeout,
            max_bytes=config.OBJECT_LIST_RESPONSE_MAX_BYTES,
            idempotent=True,
            params=params,
        )
        value = parse_json(reply.body, errors=ObjectStorageError, route=OBJECTS)
        objects = value.get("objects") if isinstance(value, dict) else None
        next_cursor = value.get("nextCursor") if isinstance(value, dict) else None
        if not isinstance(objects, list) or len(objects) > limit:
            raise ObjectStorageError.of("invalid", f"{OBJECTS}: 'objects' is not a page")
        if next_cursor is not None and (not isinstance(next_cursor, str) or not next_cursor):
            raise ObjectStorageError.of("invalid", f"{OBJECTS}: 'nextCursor' is invalid")
        page = [_object_info(item, OBJECTS) for item in objects]
        if cursor and page and page[0].key <= cursor:
            raise ObjectStorageError.of("invalid", f"{OBJECTS}: the page does not move forward")
        return ObjectPage(objects=page, next_cursor=next_cursor or None)

    def iter_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object under ``prefix`` in key order, one page (100) at a time."""
        cursor: str | None = None
        while True:
            page = self.list_objects(prefix, cursor=cursor)
            yield from page.objects
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def listdir(self, path: str) -> tuple[list[str], list[str]]:
        """``(directories, files)`` directly under ``path`` (keys split on ``/``). Reads the
        listing under the prefix; refuses (``STORAGE_LISTING_TOO_LARGE``) past 100 000 objects."""
        prefix = path.strip("/")
        prefix = f"{prefix}/" if prefix else ""
        directories: dict[str, None] = {}
        files: list[str] = []
        for count, info in enumerate(self.iter_objects(prefix), start=1):
            if count > LISTDIR_MAX_OBJECTS:
                raise ObjectStorageError.of(
                    "listing_too_large",
                    f"more than {LISTDIR_MAX_OBJECTS} objects under {prefix!r}; use iter_objects",
                )
            head, slash, _ = info.key[len(prefix) :].partition("/")
            if slash:
                directories[head] = None
            else:
                files.append(head)
        return list(directories), files

    # -- probes --------------------------------------------------------------------------------

    def health(self, *, timeout_ms: int | None = None) -> Health:
        """GET the storage health route: truthy when Dify answers ``{"ok": true}``; never
        raises (the detail names the failure). ``timeout_ms`` (default: the storage timeout)
        lets a readiness probe answer sooner."""
        try:
            reply = self.transport.request(
                "GET",
                HEALTH,
                errors=ObjectStorageError,
                timeout=(timeout_ms or self.timeout_ms) / 1000,
                max_bytes=4096,
                idempotent=True,
            )
            value = parse_json(reply.body, errors=ObjectStorageError, route=HEALTH)
        except DifyError as exc:
            return Health(False, exc.code + (f" ({exc.status})" if exc.status else ""))
        if isinstance(value, dict) and value.get("ok") is True:
            return Health(True, "dify")
        return Health(False, "Dify storage reports not ok")

    def url(self, name: str | None) -> str:
        raise NotImplementedError("Dify objects have no public URL; read them through the API")


class _Body:
    """A request body streamed from a seekable file: ``read`` for urllib3, ``__len__`` for the
    ``Content-Length`` requests sets."""

    def __init__(self, source: IO[bytes], size: int) -> None:
        self._source, self._size = source, size

    def read(self, amt: int = -1) -> bytes:
        return self._source.read(amt)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self._source.read(CHUNK_BYTES):
            yield chunk


def _seekable(content: File[bytes] | bytes, limit: int) -> IO[bytes]:
    """A seekable binary source for ``content`` (bytes, a Django File, any file object)."""
    if isinstance(content, bytes | bytearray | memoryview):
        return io.BytesIO(bytes(content))
    try:
        content.seek(0)
        return content
    except (AttributeError, OSError, io.UnsupportedOperation, ValueError):
        pass
    spool = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024)
    total = 0
    for chunk in content.chunks() if hasattr(content, "chunks") else iter(content):
        total += len(chunk)
        if total > limit:
            spool.close()
            raise ObjectStorageError.of("too_large", f"object is larger than {limit} bytes")
        spool.write(chunk)
    return spool
