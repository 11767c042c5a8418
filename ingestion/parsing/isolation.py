"""Parser isolation: one document's whole parse in a child process, bounded in time and memory.

Some damaged PDFs make text extraction spin forever (pypdf #1825, the security advisory of
#582), and ``try``/``except`` cannot stop a loop; a native library may also crash or run out
of memory. :func:`parse_isolated` therefore runs :func:`ingestion.parsing.parse_with_report`
in a child process and:

* **Hard wall-clock timeout.** After ``timeout_s`` (``KNOWLEDGE_PARSER_TIMEOUT_SECONDS``) every
  process of the child's session is SIGKILLed (the child calls ``setsid()``, so ``pdftoppm``
  and ``tesseract`` grandchildren, even in process groups of their own, die with it) and the
  child is reaped. The child also guards itself: a watchdog thread in it checks every 0.5 s
  that the worker which started it still lives (pid and start time from ``/proc``) and that
  the hard limit plus a 5 s margin has not passed, and otherwise SIGKILLs its whole session,
  so a worker killed from outside (``kill -9``, the OOM killer) leaves no parse running.
  :class:`ParserTimeout` (a ``TimeoutError``) is raised, which compilation records as the
  terminal ``parser_timeout``. The calling thread is free at once. Time the child spends
  waiting for a PDF rasterizer slot (a page batch queued behind other documents) is not
  counted: the child publishes its waits (:class:`~ingestion.parsing.rasterize.SlotWaits`)
  and the limit moves by them; the waits have their own bound and code (``rasterizer_busy``,
  retryable).
* **Memory cap.** ``RLIMIT_AS`` of ``memory_bytes`` (``KNOWLEDGE_PARSER_MAX_MEMORY_MB``), also
  inherited by the child's ``pdftoppm`` and ``tesseract``; a ``MemoryError`` ends the parse
  with ``parser_memory_exceeded``; a child killed by a signal (the kernel's OOM killer, a crash
  in a native library) with ``parser_crashed``. Both are terminal.
* **Cheap start, no inherited threads.** Children come from multiprocessing's ``forkserver``:
  one server process per worker process, started on first use with the parsing modules
  preloaded, forks a single-threaded child per document (the worker's own threads, e.g. the
  lease keeper, are never duplicated into it). The server is made a child subreaper, so the
  orphans of a killed child are re-parented to it and reaped (nothing is left as a zombie even
  where PID 1 does not reap).
* **Results through files.** The source bytes go to a private temp directory (mode 0700) and
  the report (elements, assets, page accounting) comes back pickled in the same directory,
  removed after. The child's ``TMPDIR`` (and ``tempfile.tempdir``) is a subdirectory of it, so
  every temporary file of the parse (the PDF for ``pdftoppm``, Tesseract's files) is removed
  with it, also when the child was killed.

A django-q2 worker is a daemonic process by default, and daemonic processes may not start
children; ``Q_CLUSTER["daemonize_workers"]`` is therefore ``False`` (knowledgefs/settings/).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import pickle
import resource
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import context as mp_context
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from typing import Any

from . import page_progress, rasterize
from .base import ParseReport
from .errors import ParseError

#: Modules the forkserver imports once, so each child starts with them loaded.
PRELOAD = [
    "ingestion.parsing._forkserver_init",
    "ingestion.parsing",
    "ingestion.parsing.isolation",
    "pdfplumber",
]
_DEFAULT_TARGET = "ingestion.parsing:parse_with_report"


class ParserTimeout(TimeoutError):
    """The parse ran past its hard limit and its processes were killed."""


class ParseCanceled(Exception):
    """``should_stop`` answered true (the job was canceled or taken over); the parse's
    processes were killed. Not a parse failure: the caller drops the job's attempt."""


class ParserCrashed(ParseError):
    """``parser_crashed``: the parser process died (killed by a signal: OOM killer, crash)."""

    code = "parser_crashed"


class ParserOutOfMemory(ParseError):
    """``parser_memory_exceeded``: the parse needed more than the memory cap."""

    code = "parser_memory_exceeded"


@dataclass(frozen=True)
class IsolationConfig:
    """Limits of one isolated parse.

    Attributes:
        timeout_s: wall-clock limit of the whole parse, seconds (default 300, ``10..3600``).
        memory_bytes: ``RLIMIT_AS`` of the child (default 2 GiB, 256 MiB..64 GiB).
    """

    timeout_s: float = 300.0
    memory_bytes: int = 2048 * 1024 * 1024

    @classmethod
    def from_settings(cls) -> IsolationConfig:
        """The configured limits (``KNOWLEDGE_PARSER_TIMEOUT_SECONDS``,
        ``KNOWLEDGE_PARSER_MAX_MEMORY_MB``)."""
        from django.conf import settings

        return cls(
            timeout_s=float(settings.KNOWLEDGE_PARSER_TIMEOUT_SECONDS),
            memory_bytes=settings.KNOWLEDGE_PARSER_MAX_MEMORY_MB * 1024 * 1024,
        )


_server: forkserver.ForkServer | None = None
_server_lock = threading.Lock()


def _forget_server() -> None:
    """After ``fork()`` (django-q2 forks its workers): this process starts a server of its own.

    The inherited one belongs to the parent (it is not our child, so it cannot be waited for),
    and its liveness pipe is closed here so the parent's server still ends with the parent.
    """
    global _server, _server_lock
    inherited, _server, _server_lock = _server, None, threading.Lock()
    fd = getattr(inherited, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


os.register_at_fork(after_in_child=_forget_server)


def _forkserver() -> forkserver.ForkServer:
    """This process's parser forkserver (started on the first child, preloading
    :data:`PRELOAD`); separate from multiprocessing's shared one, whose preload is global."""
    global _server
    with _server_lock:
        if _server is None:
            _server = forkserver.ForkServer()
            _server.set_forkserver_preload(PRELOAD)
    return _server


class _Popen(popen_forkserver.Popen):
    """multiprocessing's forkserver launcher, minus the re-run of ``__main__`` in the child.

    A multiprocessing child normally re-imports the parent's main module (``manage.py``, a
    gunicorn or pytest entry point, or nothing importable at all for ``python -``); the parser
    child needs none of it, so the preparation data leaves it out. Otherwise the launch is
    Python 3.11's ``popen_forkserver.Popen._launch``.
    """

    _fds: list[int]  # set by popen_forkserver.Popen.__init__ (typeshed leaves it out)

    def _launch(self, process_obj):
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_path", None)
        prep_data.pop("init_main_from_name", None)
        buf = io.BytesIO()
        mp_context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            mp_context.set_spawning_popen(None)
        self.sentinel, w = _forkserver().connect_to_new_process(self._fds)
        _parent_w = os.dup(w)
        # typeshed leaves out multiprocessing.util.close_fds (Python 3.11 has it).
        close_fds = util.close_fds  # type: ignore[attr-defined]
        self.finalizer = util.Finalize(self, close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _ParserProcess(mp_context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        return _Popen(process_obj)


def parse_isolated(
    data: bytes,
    mime_type: str,
    *,
    config: IsolationConfig | None = None,
    raster: rasterize.RasterConfig | None = None,
    target: str = _DEFAULT_TARGET,
    should_stop: Callable[[], bool] | None = None,
    on_pages: Callable[[int, int], None] | None = None,
) -> ParseReport:
    """Run ``target(data, mime_type)`` (by default ``parse_with_report``) in a child process.

    Args:
        data, mime_type: as for :func:`ingestion.parsing.parse_with_report`.
        config: time and memory limits (default: the settings).
        raster: rasterization/OCR limits installed in the child (default: the settings).
        target: ``"module:function"`` run in the child (tests use it for a parse that spins).
        should_stop: asked about every :data:`STOP_POLL_S` seconds while the child runs (e.g.
            "was the job canceled?"); when it answers true the parse is killed.
        on_pages: called with ``(pages parsed, pages in all)`` as often as the child reports a
            change (:mod:`.page_progress`: a PDF after its pages), polled like ``should_stop``.

    Returns the child's :class:`ParseReport`.

    Raises:
        ParseError: whatever the parser raised (same ``code`` and ``message``);
            :class:`ParserOutOfMemory`; :class:`ParserCrashed`.
        ParserTimeout: the hard limit passed; every process of the parse is gone.
        ParseCanceled: ``should_stop`` answered true; every process of the parse is gone.
    """
    config = config or IsolationConfig.from_settings()
    raster = raster or rasterize.current()
    # mkdtemp creates the directory mode 0700; the child's TMPDIR is a subdirectory of it, so
    # every temporary file of the parse (the PDF for pdftoppm, tesseract's input and output)
    # is removed with it, even when the child was killed.
    with tempfile.TemporaryDirectory(prefix="kfs-parse-") as tmp:
        source, result = os.path.join(tmp, "source"), os.path.join(tmp, "result.pickle")
        waits = os.path.join(tmp, "slot-waits")
        pages = os.path.join(tmp, "pages")
        work = os.path.join(tmp, "tmp")
        os.mkdir(work, 0o700)
        with open(source, "wb") as handle:
            handle.write(data)
        job = _ChildJob(
            source=source, mime_type=mime_type, result=result, memory_bytes=config.memory_bytes,
            raster=raster, target=target, tmpdir=work, parent_pid=os.getpid(),
            parent_start=process_start_time(os.getpid()), hard_limit_s=config.timeout_s,
            slot_waits=waits, pages=pages,
        )  # fmt: skip
        child = _ParserProcess(target=_child_main, args=(job,), name="kfs-parser", daemon=True)
        child.start()
        pid = child.pid
        assert pid is not None  # set by start()
        timed_out = canceled = False
        waited = 0.0
        seen: tuple[int, int] | None = None
        try:
            # The budget runs while the parse runs, not while it waits for a rasterizer slot
            # (that wait has its own bound, raster.slot_wait_s, and code, rasterizer_busy).
            deadline = time.monotonic() + config.timeout_s
            most_wait = raster.slot_wait_s + CHILD_LIMIT_MARGIN_S
            while child.exitcode is None and not canceled:
                waited = min(rasterize.SlotWaits.read(waits), most_wait)
                remaining = deadline + waited - time.monotonic()
                if remaining <= 0:
                    break
                child.join(min(remaining, STOP_POLL_S))
                if on_pages is not None and (now := page_progress.read(pages)) not in (None, seen):
                    seen = now
                    on_pages(*now)
                canceled = child.exitcode is None and should_stop is not None and should_stop()
            timed_out = child.exitcode is None and not canceled
        finally:
            if child.exitcode is None:  # timed out, or this thread was interrupted
                kill_session(pid)
                child.join()
        if canceled:
            raise ParseCanceled("the parse was stopped on request")
        if timed_out:
            note = f" (not counting {waited:.0f} s waiting for a rasterizer slot)"
            raise ParserTimeout(
                f"the parser exceeded its limit of {config.timeout_s:g} s and was stopped"
                + (note if waited >= 1 else "")
            )
        return _outcome(child, result)


@dataclass(frozen=True)
class _ChildJob:
    """What the parser child needs: its input and output paths, limits and its parent."""

    source: str
    mime_type: str
    result: str
    memory_bytes: int
    raster: rasterize.RasterConfig
    target: str
    tmpdir: str
    parent_pid: int
    parent_start: int | None
    hard_limit_s: float
    slot_waits: str = ""
    pages: str = ""


#: How often ``parse_isolated`` asks its ``should_stop`` (our choice: a cancel stops a parse
#: within about a second).
STOP_POLL_S = 1.0
#: The child kills its own session this long after its hard limit when its parent has not (the
#: parent normally kills it at the limit; our choice: margin for a loaded machine).
CHILD_LIMIT_MARGIN_S = 5.0
#: How often the child's watchdog looks at its parent and its deadline (our choice).
WATCHDOG_INTERVAL_S = 0.5


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of ``/proc/<pid>/stat``), or
    ``None`` when the process is gone or a zombie; with the pid it names a process uniquely."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _watchdog(parent_pid: int, parent_start: int | None, deadline: float, job_dir: str) -> None:
    """In the child: kill this whole session when the parent (the worker) is gone or the hard
    limit plus :data:`CHILD_LIMIT_MARGIN_S` has passed, so no parse outlives its worker or its
    limit even when the parent was SIGKILLed (``PR_SET_PDEATHSIG`` fires only when the
    forkserver, the child's real parent, exits). With the parent gone, nobody else removes the
    per-parse directory ``job_dir``, so it is removed here, between the two kills."""
    while True:
        time.sleep(WATCHDOG_INTERVAL_S)
        # parent_start is None only where /proc could not be read: then the deadline alone.
        gone = parent_start is not None and process_start_time(parent_pid) != parent_start
        if gone or time.monotonic() > deadline + rasterize.slot_waited():
            _kill_own_session(job_dir if gone else None)


def _kill_own_session(remove: str | None = None) -> None:
    """SIGKILL every other process of this session (``pdftoppm``, ``tesseract``, in groups of
    their own), remove the directory ``remove`` (if given), then SIGKILL this process."""
    me = os.getpid()
    sid = os.getsid(0)
    for _ in range(3):
        members = [p for p, _, s in rasterize._proc_table() if s == sid and p != me]
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not members:
            break
    if remove:
        shutil.rmtree(remove, ignore_errors=True)
    os.kill(me, signal.SIGKILL)


def _outcome(child, result: str) -> ParseReport:
    if os.path.exists(result):
        with open(result, "rb") as handle:
            outcome = pickle.load(handle)  # noqa: S301 - written by our own child
        if outcome[0] == "ok":
            return outcome[1]
        _, code, message = outcome
        raise ParseError(message, code=code)
    code = child.exitcode
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        raise ParserCrashed(f"the parser process died ({name}); the document was not parsed")
    raise ParserCrashed(f"the parser process died (exit status {code}) without a result")


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (the child and whatever it started)."""
    for _ in range(3):
        members = [pid for pid, _, session in rasterize._proc_table() if session == sid]
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(sid, signal.SIGKILL)
        if not members:
            return
        time.sleep(0.01)


def _child_main(job: _ChildJob) -> None:
    """Child process: own session, watchdog, private TMPDIR, memory cap, parse, pickle the
    outcome to ``job.result``."""
    os.setsid()
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    # Dies with the forkserver; the watchdog covers a worker killed from outside (its own
    # timeout guard, the OOM killer, kill -9) while the forkserver lives on.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    deadline = time.monotonic() + job.hard_limit_s + CHILD_LIMIT_MARGIN_S
    threading.Thread(
        target=_watchdog,
        args=(job.parent_pid, job.parent_start, deadline, os.path.dirname(job.source)),
        name="kfs-parser-watchdog", daemon=True,
    ).start()  # fmt: skip
    os.environ["TMPDIR"] = job.tmpdir
    tempfile.tempdir = job.tmpdir
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (job.memory_bytes, job.memory_bytes))
    os.environ["OMP_THREAD_LIMIT"] = "1"
    rasterize.configure(job.raster)
    rasterize.track_slot_waits(job.slot_waits)
    page_progress.track(job.pages)
    module, _, name = job.target.partition(":")
    memory_bytes, result = job.memory_bytes, job.result
    outcome: tuple[str, Any] | tuple[str, str, str]
    try:
        with open(job.source, "rb") as handle:
            data = handle.read()
        report = getattr(importlib.import_module(module), name)(data, job.mime_type)
        outcome = ("ok", report)
    except ParseError as exc:
        outcome = ("error", exc.code, exc.message)
    except MemoryError:
        outcome = (
            "error",
            ParserOutOfMemory.code,
            f"the parser needed more than its memory limit of {memory_bytes // 2**20} MiB",
        )
    except RecursionError:
        outcome = ("error", "corrupt_document", "corrupt or unreadable document (nesting too deep)")
    except Exception as exc:  # noqa: BLE001 - reported, never a traceback to the client
        outcome = ("error", "parse_error", f"the parser failed ({type(exc).__name__})")
    partial = result + ".part"
    with open(partial, "wb") as handle:
        pickle.dump(outcome, handle, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(partial, result)


_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    """Linux ``prctl(option, value)``; silently nothing where it is unavailable."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, int(value), 0, 0, 0)
