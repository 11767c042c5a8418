"""Bounded inspection of ZIP containers (DOCX, XLSX, PPTX, EPUB, ...) before any parser opens them.

Only the end-of-central-directory record and the central directory are read; no entry is
inflated. Containers that could exhaust memory or disk when a parser (ours or a remote one)
expands them are rejected with :class:`ArchiveRejected` (code ``archive_rejected``):

* ZIP64 containers (a ZIP64 end-of-central-directory locator, 0xFFFF/0xFFFFFFFF sentinels, or a
  ZIP64 extra field on an entry) - no office document of an admitted size needs one;
* multi-disk (spanned) archives;
* more than ``max_entries`` entries;
* more than ``max_expanded_bytes`` of declared uncompressed content.

Declared sizes are a sound bound for our own parsers: :mod:`zipfile` stops inflating an entry at
its declared ``file_size`` and then checks the CRC, so a lying header cannot expand further.

The thresholds for routing a container to the remote parser's heavy lane (seed deployment guide:
"ZIP-backed remote formats become heavy when their admitted body exceeds 8 MiB or a bounded
central-directory inspection identifies a large container ... more than 64 MiB of declared
expanded content") are in :func:`is_heavy`. Parsers of ZIP-based formats admit their container
with :func:`admit_zip` and read its images with :func:`zip_images`.
"""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass

from .base import MAX_ASSETS, Asset, image_asset, image_mime_type
from .errors import CorruptDocument, ParseError

#: Default cap on entries in one container (a 300-slide deck has about 1,500).
MAX_ENTRIES = 10_000
#: Default cap on the declared uncompressed size of all entries together (256 MiB).
MAX_EXPANDED_BYTES = 256 * 1024 * 1024
#: Heavy-lane thresholds (seed deployment guide, "Unstructured"): body over 8 MiB, declared
#: expansion over 64 MiB; "many entries" is ours: 2,000.
HEAVY_BODY_BYTES = 8 * 1024 * 1024
HEAVY_EXPANDED_BYTES = 64 * 1024 * 1024
HEAVY_ENTRIES = 2_000

_EOCD_SIG = b"PK\x05\x06"
_EOCD64_LOCATOR_SIG = b"PK\x06\x07"
_EOCD_SIZE = 22
_MAX_COMMENT = 0xFFFF
_ZIP64_EXTRA_ID = 0x0001


class ArchiveRejected(ParseError):
    """A container refused before parsing (ZIP64, multi-disk, too many entries, too large
    when expanded). The message names the limit."""

    code = "archive_rejected"


@dataclass(frozen=True)
class ZipSummary:
    """What the central directory of an admitted container declares.

    Attributes:
        entries: number of entries.
        declared_bytes: sum of declared uncompressed sizes, bytes.
        compressed_bytes: sum of compressed sizes, bytes.
        names: entry names in directory order.
    """

    entries: int
    declared_bytes: int
    compressed_bytes: int
    names: tuple[str, ...]


def _end_record(data: bytes) -> tuple[int, bytes]:
    """Return (offset, bytes) of the end-of-central-directory record."""
    tail_start = max(0, len(data) - _EOCD_SIZE - _MAX_COMMENT)
    offset = data.rfind(_EOCD_SIG, tail_start)
    if offset < 0 or offset + _EOCD_SIZE > len(data):
        raise CorruptDocument("corrupt or unreadable archive: no end of central directory")
    return offset, data[offset : offset + _EOCD_SIZE]


def inspect_zip(
    data: bytes,
    *,
    max_entries: int = MAX_ENTRIES,
    max_expanded_bytes: int = MAX_EXPANDED_BYTES,
) -> ZipSummary:
    """Read the central directory of ``data`` without inflating anything and admit or refuse it.

    Args:
        data: the whole container.
        max_entries: refuse containers with more entries.
        max_expanded_bytes: refuse containers declaring more uncompressed bytes in total.

    Returns:
        :class:`ZipSummary` of the admitted container.

    Raises:
        ArchiveRejected: ZIP64, multi-disk, too many entries, or too large when expanded.
        CorruptDocument: not a readable ZIP (no end record, damaged central directory).
    """
    offset, record = _end_record(data)
    (_sig, disk, cd_disk, disk_entries, total_entries, cd_size, cd_offset, _clen) = struct.unpack(
        "<4sHHHHIIH", record
    )
    locator = offset - 20
    if locator >= 0 and data[locator : locator + 4] == _EOCD64_LOCATOR_SIG:
        raise ArchiveRejected("archive rejected: ZIP64 containers are not accepted")
    if 0xFFFF in (disk, cd_disk, disk_entries, total_entries) or 0xFFFFFFFF in (
        cd_size,
        cd_offset,
    ):
        raise ArchiveRejected("archive rejected: ZIP64 containers are not accepted")
    if disk != 0 or cd_disk != 0 or disk_entries != total_entries:
        raise ArchiveRejected("archive rejected: multi-disk (spanned) archives are not accepted")
    if total_entries > max_entries:
        raise ArchiveRejected(
            f"archive rejected: {total_entries} entries exceed the limit of {max_entries}"
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as container:
            infos = container.infolist()
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        NotImplementedError,
        ValueError,
        struct.error,
    ) as exc:
        raise CorruptDocument("corrupt or unreadable archive") from exc
    declared = compressed = 0
    for info in infos:
        if _has_zip64_extra(info.extra):
            raise ArchiveRejected("archive rejected: ZIP64 containers are not accepted")
        declared += info.file_size
        compressed += info.compress_size
    if len(infos) > max_entries:
        raise ArchiveRejected(
            f"archive rejected: {len(infos)} entries exceed the limit of {max_entries}"
        )
    if declared > max_expanded_bytes:
        raise ArchiveRejected(
            f"archive rejected: {declared} bytes when expanded exceed the limit of "
            f"{max_expanded_bytes} bytes ({max_expanded_bytes // (1024 * 1024)} MiB)"
        )
    return ZipSummary(
        entries=len(infos),
        declared_bytes=declared,
        compressed_bytes=compressed,
        names=tuple(info.filename for info in infos),
    )


def _has_zip64_extra(extra: bytes) -> bool:
    position = 0
    while position + 4 <= len(extra):
        header_id, size = struct.unpack_from("<HH", extra, position)
        if header_id == _ZIP64_EXTRA_ID:
            return True
        position += 4 + size
    return False


def is_heavy(summary: ZipSummary, body_bytes: int) -> bool:
    """Whether a ZIP-based upload belongs in the remote parser's heavy lane.

    Heavy when the body exceeds :data:`HEAVY_BODY_BYTES` (8 MiB), the declared expansion exceeds
    :data:`HEAVY_EXPANDED_BYTES` (64 MiB) or the container has more than :data:`HEAVY_ENTRIES`
    entries (seed deployment guide, "Unstructured").
    """
    return (
        body_bytes > HEAVY_BODY_BYTES
        or summary.declared_bytes > HEAVY_EXPANDED_BYTES
        or summary.entries > HEAVY_ENTRIES
    )


def admit_zip(data: bytes, label: str) -> ZipSummary:
    """Admit a ZIP-based document through :func:`inspect_zip` before
    its parser opens it (nothing is inflated).

    Raises:
        ArchiveRejected: (code ``archive_rejected``) ZIP64, multi-disk, too many entries or too
            large when expanded.
        CorruptDocument: ``"corrupt or unreadable <label>"`` when it is not a readable ZIP.
    """
    try:
        return inspect_zip(data)
    except ParseError as exc:
        if not isinstance(exc, CorruptDocument):
            raise  # ArchiveRejected
        raise CorruptDocument(f"corrupt or unreadable {label}") from exc
    except Exception as exc:  # noqa: BLE001 - e.g. zipfile's NotImplementedError ("zip file version")
        raise CorruptDocument(f"corrupt or unreadable {label}") from exc


def zip_images(data: bytes, names: list[str], cap: int = MAX_ASSETS) -> tuple[list[Asset], int]:
    """Read the image entries ``names`` of an admitted ZIP as ``Asset(kind="image")`` objects.

    Entries that are not images (by magic or suffix) or cannot be read are skipped. Returns
    ``(assets, skipped_over_cap)``: at most ``cap`` assets, and how many further images there
    were.
    """
    assets: list[Asset] = []
    over = 0
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for name in names:
            if len(assets) >= cap:
                over += 1
                continue
            try:
                blob = zf.read(name)
            except Exception:  # noqa: BLE001 - a damaged image must not sink the document
                continue
            mime = image_mime_type(blob, name)
            if mime is not None and blob:
                assets.append(image_asset(blob, mime, name))
    return assets, over
