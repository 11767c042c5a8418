"""Bounded inspection of ZIP containers (DOCX, XLSX, PPTX, EPUB, ...) before any parser opens them.

Only the end-of-central-directory record and the central directory are read; no entry is
inflated. Containers that could exhaust memory or disk when a parser (ours or a remote one)
expands them are rejected with :class:`ArchiveRejected` (code ``archive_rejected``):

* ZIP64 containers (a ZIP64 end-of-central-directory locator, 0xFFFF/0xFFFFFFFF sentinels, or a
  ZIP64 extra field on an entry) - no office document of an admitted size needs one;
* multi-disk (spanned) archives;
* more than ``max_entries`` entries;
* more than ``max_expanded_bytes`` of declared uncompressed content;
* an entry declaring over :data:`RATIO_MIN_BYTES` that expands more than :data:`MAX_RATIO`
  times its compressed size (an expansion bomb: zeros deflate about 1,000:1, office XML 5-50:1).

Entries whose name could address a file outside an extraction folder (``..`` components,
absolute or drive-letter paths, backslashes, NUL), that are symbolic links (Unix mode
``0o120000`` in ``external_attr``) or that are encrypted (ZIP flag bit 0) are *unsafe*: they
are left out of :attr:`ZipSummary.names`, so no parser or image reader opens them, and listed
in :attr:`ZipSummary.unsafe`; parsers name them in their warnings
(:func:`unsafe_entry_warnings`) and index the rest. Nothing here or in the parsers writes an
entry to disk: entries are read into memory by name, and stored images are keyed by job and
ordinal, never by entry name.

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
import re
import stat
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

#: Expansion-ratio limit per entry (declared size / compressed size), checked for entries
#: declaring over :data:`RATIO_MIN_BYTES`.
MAX_RATIO = 200
RATIO_MIN_BYTES = 1024 * 1024
#: Unsafe entries named one by one in the warnings; further ones are counted.
MAX_NAMED_UNSAFE = 20

_DRIVE_RE = re.compile(r"^[A-Za-z]:")
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
        names: names of the safe entries in directory order.
        unsafe: ``(name, reason)`` of every unsafe entry (see the module documentation).
    """

    entries: int
    declared_bytes: int
    compressed_bytes: int
    names: tuple[str, ...]
    unsafe: tuple[tuple[str, str], ...] = ()


def unsafe_reason(info: zipfile.ZipInfo) -> str | None:
    """Why entry ``info`` must not be opened, or ``None`` when it is safe."""
    name = info.filename
    if stat.S_ISLNK(info.external_attr >> 16):
        return "symbolic link"
    if info.flag_bits & 0x1:
        return "encrypted entry"
    if "\x00" in name:
        return "NUL in the name"
    if name.startswith("/"):
        return "absolute path"
    if _DRIVE_RE.match(name):
        return "drive-letter path"
    if "\\" in name:
        return "backslash in the path"
    if ".." in name.split("/"):
        return "path leaves the archive"
    return None


def unsafe_entry_warnings(summary: ZipSummary) -> list[str]:
    """The parse warnings naming a container's skipped unsafe entries."""
    notes = [
        f"unsafe archive entry skipped: {name!r} ({reason})"
        for name, reason in summary.unsafe[:MAX_NAMED_UNSAFE]
    ]
    if len(summary.unsafe) > MAX_NAMED_UNSAFE:
        more = len(summary.unsafe) - MAX_NAMED_UNSAFE
        notes.append(f"{more} further unsafe archive entries skipped")
    return notes


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
    """Read the central directory of ``data`` without inflating anything and admit or refuse it
    (limits and unsafe entries: see the module documentation).

    Args:
        data: the whole container.
        max_entries: refuse containers with more entries.
        max_expanded_bytes: refuse containers declaring more uncompressed bytes in total.

    Returns:
        :class:`ZipSummary` of the admitted container.

    Raises:
        ArchiveRejected: ZIP64, multi-disk, too many entries, too large when expanded, or an
            entry over the expansion-ratio limit.
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
    for info in infos:
        if info.file_size > RATIO_MIN_BYTES and info.file_size > MAX_RATIO * max(
            info.compress_size, 1
        ):
            ratio = info.file_size // max(info.compress_size, 1)
            raise ArchiveRejected(
                f"archive rejected: entry {info.filename!r} expands {ratio}:1 "
                f"({info.file_size} bytes from {info.compress_size}), over the limit of "
                f"{MAX_RATIO}:1"
            )
    unsafe = [(info.filename, unsafe_reason(info)) for info in infos]
    return ZipSummary(
        entries=len(infos),
        declared_bytes=declared,
        compressed_bytes=compressed,
        names=tuple(name for name, reason in unsafe if reason is None),
        unsafe=tuple((name, reason) for name, reason in unsafe if reason is not None),
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
