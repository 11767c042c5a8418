"""PDF page rasterization with Poppler's ``pdftoppm``, bounded in time, pixels and concurrency.

Pure Python (no Django): the limits arrive as a :class:`RasterConfig`, built by the caller from
the settings (:meth:`RasterConfig.from_settings`) and installed for the process with
:func:`configure`; a process that never configured one uses the seed's defaults.

Numbers (production deployment guide, "PDF image rasterization" and its settings table):
144 DPI page images, 48 DPI thumbnails, 30 s per Poppler operation, at most 500 rasterized
assets per document, at most 2 concurrent page batches (``1..8``). The pixel budget (25 million
pixels per rendered page, our choice) is documented on :data:`DEFAULT_MAX_PIXELS`.

Why not ``pdf2image.convert_from_bytes(timeout=)``: on a timeout it kills only its direct child
and then waits for the pipes to close, so a ``pdftoppm`` wrapper whose own child still holds the
pipe blocks it forever. :func:`run_bounded` starts the command in its own process group, kills
the whole group on expiry and reaps it, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import math
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from .errors import ParseError

#: Pixels one rendered page may have (width x height). 25 million holds an A3 page at 300 DPI
#: (3508 x 4961 = 17.4 M) and a US-letter page at 600 DPI (5100 x 6600 = 33.7 M is over, so
#: such a page is rendered at about 515 DPI); an RGB page within it is at most 75 MB in memory,
#: and it stays well below Pillow's decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``,
#: 89,478,485), which is never raised or switched off.
DEFAULT_MAX_PIXELS = 25_000_000
#: OCR resolution: Tesseract's documentation recommends at least 300 DPI for body text.
DEFAULT_OCR_DPI = 300


class RasterizationTimeout(ParseError):
    """A Poppler operation exceeded its time limit; the process group was killed and reaped.

    Retryable by the job policy (the command is gone, so a retry cannot pile up work).
    """

    code = "rasterization_timeout"


class RasterizationError(ParseError):
    """``pdftoppm`` failed (non-zero exit or no output) for a page."""

    code = "rasterization_failed"


class RasterizerBusy(ParseError):
    """``rasterizer_busy``: no page-batch slot became free within the slot-wait bound
    (:attr:`RasterConfig.slot_wait_s`). Retryable by the job policy: nothing ran."""

    code = "rasterizer_busy"


@dataclass(frozen=True)
class RasterConfig:
    """Limits of rasterization and OCR for one process.

    Attributes:
        enabled: ``False`` when ``KNOWLEDGE_PDF_RASTERIZER=off`` (no page is rendered, so no OCR
            and no page images).
        dpi: page-image resolution (seed: 144).
        thumbnail_dpi: thumbnail resolution (seed: 48).
        timeout_s: per-operation limit in seconds for ``pdftoppm`` and ``tesseract``
            (seed: 30 000 ms).
        max_assets: page images plus thumbnails stored for one document (seed: 500).
        max_concurrency: concurrent page batches per machine (seed: 2, ``1..8``).
        command: path of ``pdftoppm`` (``""``: found on ``PATH``).
        max_pixels: width x height budget of one rendered page (:data:`DEFAULT_MAX_PIXELS`).
        ocr_dpi: OCR resolution (:data:`DEFAULT_OCR_DPI`), reduced within ``max_pixels``.
        ocr_languages: Tesseract language list, e.g. ``"eng"`` or ``"eng+deu"``.
        lock_dir: directory of the slot lock files bounding concurrency across processes
            (``""``: a per-process semaphore only).
        max_pages: most pages of one PDF (seed ours: 5000); more fail ``document_too_large``.
        max_ocr_pages: most pages of one PDF without a text layer, i.e. to OCR (ours: 200).
        slot_wait_s: most seconds one parse may wait for page-batch slots in all, apart from
            the parser's own time budget, which does not count them (from the settings: the
            parser timeout, within the job timeout less the parser timeout).
    """

    enabled: bool = True
    dpi: int = 144
    thumbnail_dpi: int = 48
    timeout_s: float = 30.0
    max_assets: int = 500
    max_concurrency: int = 2
    command: str = ""
    max_pixels: int = DEFAULT_MAX_PIXELS
    ocr_dpi: int = DEFAULT_OCR_DPI
    ocr_languages: str = "eng"
    lock_dir: str = ""
    slot_wait_s: float = 300.0
    max_pages: int = 5000
    max_ocr_pages: int = 200

    @classmethod
    def from_settings(cls) -> RasterConfig:
        """Build the configuration from Django settings (call in a configured process)."""
        from django.conf import settings

        lock_dir = Path(settings.VAR_DIR) / "locks" / "pdf-rasterizer"
        parser_s = settings.KNOWLEDGE_PARSER_TIMEOUT_SECONDS
        job_s = settings.Q_CLUSTER["timeout"]
        lock_dir.mkdir(parents=True, exist_ok=True)
        return cls(
            enabled=settings.KNOWLEDGE_PDF_RASTERIZER == "poppler",
            dpi=settings.KNOWLEDGE_PDF_RASTERIZER_DPI,
            thumbnail_dpi=settings.KNOWLEDGE_PDF_RASTERIZER_THUMBNAIL_DPI,
            timeout_s=settings.KNOWLEDGE_PDF_RASTERIZER_TIMEOUT_MS / 1000,
            max_assets=settings.KNOWLEDGE_PDF_RASTERIZER_MAX_ASSETS,
            max_concurrency=settings.KNOWLEDGE_PDF_RASTERIZER_MAX_CONCURRENCY,
            command=settings.KNOWLEDGE_PDF_RASTERIZER_COMMAND,
            max_pixels=settings.KNOWLEDGE_PDF_RASTERIZER_MAX_PIXELS,
            ocr_dpi=settings.KNOWLEDGE_OCR_DPI,
            ocr_languages=settings.KNOWLEDGE_OCR_LANGUAGES,
            lock_dir=str(lock_dir),
            slot_wait_s=float(max(1, min(parser_s, job_s - parser_s - 10))),
            max_pages=settings.KNOWLEDGE_PDF_MAX_PAGES,
            max_ocr_pages=settings.KNOWLEDGE_OCR_MAX_PAGES,
        )


_config: RasterConfig | None = None


def configure(config: RasterConfig | None) -> None:
    """Install ``config`` for this process (``None``: back to :func:`current`'s fallback)."""
    global _config
    _config = config


def current() -> RasterConfig:
    """The installed configuration; else the Django settings' one if Django is configured;
    else the seed's defaults."""
    if _config is not None:
        return _config
    try:
        from django.conf import settings

        if settings.configured:
            return RasterConfig.from_settings()
    except Exception:  # noqa: BLE001 - no Django here: defaults
        pass
    return RasterConfig()


def command_path(config: RasterConfig) -> str | None:
    """The ``pdftoppm`` to run, or ``None`` when it is not installed."""
    if config.command:
        return config.command if os.access(config.command, os.X_OK) else None
    return shutil.which("pdftoppm")


def fit_dpi(width_pt: float, height_pt: float, dpi: int, max_pixels: int) -> int:
    """The largest DPI <= ``dpi`` at which a ``width_pt`` x ``height_pt`` page (PDF points,
    1/72 inch, from its MediaBox) renders to at most ``max_pixels`` pixels; at least 1.

    Example: a 120 x 120 inch page (8640 pt square) at 144 DPI would be 17280 x 17280 = 299 M
    pixels; with 25 M pixels it renders at 41 DPI (4920 x 4920).
    """
    w_in, h_in = max(width_pt, 1.0) / 72.0, max(height_pt, 1.0) / 72.0
    # pdftoppm rounds each side up, so keep one pixel of slack per side.
    limit = math.floor(math.sqrt(max_pixels / (w_in * h_in)))
    while limit > 1 and math.ceil(w_in * limit) * math.ceil(h_in * limit) > max_pixels:
        limit -= 1
    return max(1, min(dpi, limit))


# --- bounded subprocess -------------------------------------------------------------------------


def run_bounded(
    args: list[str],
    timeout_s: float,
    *,
    what: str = "pdftoppm",
    timeout_error: type[ParseError] | None = None,
    label: str = "rasterization",
) -> None:
    """Run ``args`` in a new process group; on expiry kill the whole group and reap it.

    Raises:
        RasterizationTimeout (or ``timeout_error``): "<label> timed out after N s" (the group
            was SIGKILLed and its leader reaped; orphans are reaped by :func:`reap_group`).
        RasterizationError: the command could not start or exited non-zero.
    """
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                process_group=0, close_fds=True, preexec_fn=_die_with_parent,
            )  # fmt: skip
        except OSError as exc:
            raise RasterizationError(f"could not start {what} ({exc.strerror})") from exc
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.wait()
            reap_group(proc.pid)
            error = timeout_error or RasterizationTimeout
            raise error(f"{label} timed out after {timeout_s:g} s") from None
        except BaseException:
            kill_group(proc.pid)
            proc.wait()
            raise
        if code != 0:
            err.seek(0)
            detail = err.read(300).decode("utf-8", "replace").strip().splitlines()
            raise RasterizationError(
                f"{what} failed (exit {code}{': ' + detail[-1] if detail else ''})"
            )


def _die_with_parent() -> None:
    """In the forked command, before exec: SIGKILL it when its parent dies (Linux
    ``PR_SET_PDEATHSIG``), so a killed parser never leaves a ``pdftoppm`` running."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def kill_group(pgid: int) -> None:
    """SIGKILL every process of group ``pgid`` (a vanished group is not an error)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def reap_group(pgid: int, wait_s: float = 1.0) -> None:
    """Reap killed members of group ``pgid`` that were re-parented to this process (which is a
    child subreaper inside the parser sandbox, see :mod:`ingestion.parsing.isolation`)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        members = [pid for pid, pgrp, _ in _proc_table() if pgrp == pgid]
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.02)


def _proc_table() -> list[tuple[int, int, int]]:
    """``(pid, process group, session)`` of every process, from ``/proc/<pid>/stat``."""
    rows = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 3:
            rows.append((int(entry), int(fields[2]), int(fields[3])))
    return rows


# --- concurrency --------------------------------------------------------------------------------

_local_slots: dict[int, threading.BoundedSemaphore] = {}
_local_lock = threading.Lock()


class SlotWaits:
    """The time this process spent waiting for page-batch slots, published to ``path`` (total
    seconds and, while waiting, the ``time.monotonic()`` the wait began: one machine-wide
    clock) so the process that started the parse can leave it out of the parse's budget."""

    def __init__(self, path: str) -> None:
        self.path, self.total = path, 0.0
        self.since: float | None = None

    def begin(self) -> None:
        self.since = time.monotonic()
        self._publish()

    def end(self) -> None:
        if self.since is not None:
            self.total += time.monotonic() - self.since
            self.since = None
            self._publish()

    def waited(self) -> float:
        """Seconds waited so far, the wait under way included."""
        return self.total + (time.monotonic() - self.since if self.since is not None else 0.0)

    def _publish(self) -> None:
        partial = self.path + ".part"
        with open(partial, "w") as handle:
            handle.write(f"{self.total!r} {self.since or 0.0!r}")
        os.replace(partial, self.path)

    @staticmethod
    def read(path: str) -> float:
        """Seconds waited so far by the process publishing to ``path`` (0 when none)."""
        try:
            with open(path) as handle:
                total, since = (float(x) for x in handle.read().split())
        except (OSError, ValueError):
            return 0.0
        return total + (time.monotonic() - since if since else 0.0)


_waits: SlotWaits | None = None


def track_slot_waits(path: str | None) -> None:
    """Publish this process's slot waits to ``path`` (the isolated parser child calls it)."""
    global _waits
    _waits = SlotWaits(path) if path else None


def slot_waited() -> float:
    """Seconds this process waited for page-batch slots (0 unless :func:`track_slot_waits`)."""
    return _waits.waited() if _waits is not None else 0.0


@contextlib.contextmanager
def batch_slot(config: RasterConfig):
    """Hold one of ``config.max_concurrency`` page-batch slots while rendering.

    With a ``lock_dir`` the slots are ``flock``-ed files shared by every process using that
    directory (the kernel releases a killed holder's lock, so a killed parser never leaks a
    slot); without one, a semaphore of this process. The wait is not part of the parser's time
    budget (:class:`SlotWaits`); it has its own bound, ``config.slot_wait_s`` for all the waits
    of one parse, past which :class:`RasterizerBusy` is raised.
    """
    budget = config.slot_wait_s - (_waits.total if _waits is not None else 0.0)
    if not config.lock_dir:
        with _local_lock:
            sem = _local_slots.setdefault(
                config.max_concurrency, threading.BoundedSemaphore(config.max_concurrency)
            )
        if not sem.acquire(blocking=False):
            _waiting(True)
            try:
                granted = sem.acquire(timeout=max(budget, 0.0))
            finally:
                _waiting(False)
            if not granted:
                raise _busy(config)
        try:
            yield
        finally:
            sem.release()
        return
    handles = []
    try:
        for index in range(config.max_concurrency):
            path = os.path.join(config.lock_dir, f"slot-{index}.lock")
            handles.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        handle = _try_slots(handles)
        if handle is None:
            deadline = time.monotonic() + budget
            _waiting(True)
            try:
                while handle is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                    handle = _try_slots(handles)
            finally:
                _waiting(False)
            if handle is None:
                raise _busy(config)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        for handle in handles:
            os.close(handle)


def _try_slots(handles: list[int]) -> int | None:
    for handle in handles:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        return handle
    return None


def _waiting(start: bool) -> None:
    if _waits is not None:
        _waits.begin() if start else _waits.end()


def _busy(config: RasterConfig) -> RasterizerBusy:
    return RasterizerBusy(
        f"no PDF rasterizer slot became free within {config.slot_wait_s:g} s "
        f"({config.max_concurrency} concurrent page batches per machine are busy)"
    )


# --- rendering ----------------------------------------------------------------------------------


def render_page(
    pdf_path: str,
    page_number: int,
    *,
    width_pt: float,
    height_pt: float,
    dpi: int,
    gray: bool = False,
    config: RasterConfig | None = None,
) -> Image.Image:
    """Render one page (1-based) of the PDF at ``pdf_path`` to a Pillow image.

    The DPI is reduced with :func:`fit_dpi` so the image stays within ``config.max_pixels``;
    ``width_pt``/``height_pt`` are the page's displayed size in points (its CropBox, which
    ``pdftoppm -cropbox`` renders, with width and height swapped for ``/Rotate`` 90 or 270).
    One ``pdftoppm`` call is one page batch: it holds a :func:`batch_slot` and is bounded by
    ``config.timeout_s``.

    Raises:
        RasterizationTimeout, RasterizationError: see :func:`run_bounded`; also
        ``RasterizationError`` when rasterization is off or ``pdftoppm`` is not installed, and
        when its output is not a decodable image of the expected size.
    """
    config = config or current()
    command = command_path(config) if config.enabled else None
    if command is None:
        raise RasterizationError("PDF rasterization is unavailable (off or pdftoppm missing)")
    dpi = fit_dpi(width_pt, height_pt, dpi, config.max_pixels)
    with tempfile.TemporaryDirectory(prefix="kfs-raster-") as tmp:
        out = os.path.join(tmp, "page")
        args = [command, "-f", str(page_number), "-l", str(page_number), "-r", str(dpi)]
        args += ["-singlefile", "-png", "-cropbox"] + (["-gray"] if gray else [])
        args += [pdf_path, out]
        with batch_slot(config):
            run_bounded(args, config.timeout_s)
        png = out + ".png"
        if not os.path.exists(png):
            raise RasterizationError(f"pdftoppm produced no image for page {page_number}")
        return _load_page_image(png, page_number, expected_size(width_pt, height_pt, dpi), config)


#: Pixels a rendered side may differ from :func:`expected_size` (pdftoppm's rounding; our choice).
SIZE_TOLERANCE_PX = 2


def expected_size(width_pt: float, height_pt: float, dpi: int) -> tuple[int, int]:
    """Pixel size ``(width, height)`` of a ``width_pt`` x ``height_pt`` area (points, as
    displayed, i.e. after ``/Rotate``) rendered at ``dpi``."""
    return round(width_pt * dpi / 72.0), round(height_pt * dpi / 72.0)


def _load_page_image(png: str, page_number: int, expected: tuple[int, int], config) -> Image.Image:
    """Decode the rasterizer's output. Anything that is not a decodable image of the expected
    size (+/- :data:`SIZE_TOLERANCE_PX`; e.g. the 1 x 1 white page Poppler writes after a
    "Bogus memory allocation size") is a :class:`RasterizationError`, never a corrupt PDF."""
    try:
        with Image.open(png) as image:
            size = image.size
            if size[0] * size[1] > config.max_pixels:
                raise RasterizationError(
                    f"page {page_number} rendered to {size[0]}x{size[1]} pixels, "
                    f"over the budget of {config.max_pixels}"
                )
            if any(abs(a - b) > SIZE_TOLERANCE_PX for a, b in zip(size, expected, strict=True)):
                raise RasterizationError(
                    f"page {page_number} rendered to {size[0]}x{size[1]} pixels instead of "
                    f"{expected[0]}x{expected[1]}"
                )
            image.load()
            return image.copy()
    except RasterizationError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        raise RasterizationError(
            f"the rasterizer wrote an unreadable image for page {page_number}"
        ) from exc
    except Image.DecompressionBombError as exc:
        raise RasterizationError(
            f"the rasterizer wrote an oversized image for page {page_number}"
        ) from exc


def encode_png(image: Image.Image) -> bytes:
    """PNG bytes of ``image`` (optimised for size, not speed)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False, compress_level=6)
    return buffer.getvalue()


def scaled(image: Image.Image, factor: float) -> Image.Image:
    """``image`` scaled by ``factor`` (<= 1; 1 returns it unchanged), at least 1 x 1 pixel."""
    if factor >= 1:
        return image
    size = (max(1, round(image.width * factor)), max(1, round(image.height * factor)))
    return image.resize(size, Image.Resampling.LANCZOS)


def with_config(**changes) -> RasterConfig:
    """A copy of :func:`current` with ``changes`` applied (for callers and tests)."""
    return replace(current(), **changes)
