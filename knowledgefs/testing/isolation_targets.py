"""Parse targets run inside the isolated parser child by name (no Django imports here: the child
is a bare process with only the parsing modules loaded)."""

from __future__ import annotations

import os
import signal
import subprocess
import zlib
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from ingestion.parsing import ParseReport


def lane_marker(base: int) -> str:
    """A ``sleep`` argument unique to this test pass: ``base`` plus a number drawn from
    ``KNOWLEDGE_VAR_DIR``, which each pass of ``make test`` sets apart and every process it
    starts inherits (the tests find their processes by command line, machine-wide)."""
    lane = zlib.crc32(os.environ.get("KNOWLEDGE_VAR_DIR", "").encode()) % 1_000_000
    return str(base + lane)


#: The grandchild ``sleep`` a spinning parse leaves behind (found by its command line).
MARKER = lane_marker(987_000_000)


def spin_forever(data: bytes, mime_type: str) -> NoReturn:
    """Start a grandchild in a process group of its own, then loop like pypdf #1825."""
    subprocess.Popen(["sleep", MARKER], process_group=0)
    while True:
        pass


def crash(data: bytes, mime_type: str) -> NoReturn:
    """Die of SIGSEGV, as a crash in a native library would."""
    os.kill(os.getpid(), signal.SIGSEGV)
    raise RuntimeError("still alive after SIGSEGV")


def eat_memory(data: bytes, mime_type: str) -> NoReturn:
    """Allocate 64 MiB blocks until the address-space cap stops it."""
    hoard: list[bytearray] = []
    while True:
        hoard.append(bytearray(64 * 1024 * 1024))


#: Prefix of the temporary files :func:`spin_with_temp_files` leaves behind.
TEMP_MARKER = "kfs-leak-987655-"


def spin_with_temp_files(data: bytes, mime_type: str) -> NoReturn:
    """Write a copy of the document to a temporary file and directory (as the PDF parser and
    pytesseract do), then loop until killed."""
    import tempfile

    with open(tempfile.mkstemp(prefix=TEMP_MARKER)[1], "wb") as handle:
        handle.write(data)
    tempfile.mkdtemp(prefix=TEMP_MARKER)
    while True:
        pass


def hold_the_interpreter(data: bytes, mime_type: str) -> NoReturn:
    """A parse stuck in native code that never releases the GIL (the child's own watchdog
    thread can then never run): libc ``sleep`` called through ``ctypes.PyDLL``."""
    import ctypes

    ctypes.PyDLL(None).sleep(600)
    raise RuntimeError("libc sleep returned")


def parse_measuring_memory(data: bytes, mime_type: str) -> ParseReport:
    """The real parse (:func:`ingestion.parsing.parse_with_report`), then this child's peak
    resident set (``VmHWM``, KiB) appended to the report's warnings as ``"peak_rss_kib=N"``."""
    from ingestion.parsing import parse_with_report

    report = parse_with_report(data, mime_type)
    with open("/proc/self/status") as handle:
        peak = next(line.split()[1] for line in handle if line.startswith("VmHWM:"))
    report.warnings.append(f"peak_rss_kib={peak}")
    return report
