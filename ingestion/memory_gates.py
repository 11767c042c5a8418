"""Machine-wide admission gates that bound document compilation's concurrency and memory.

The numbers come from the production deployment guide: the table entries for
``KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY`` (default 2, ``1..8``; heavy lane one less,
minimum 1), ``KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY`` (default 4, ``1..32``) and
``KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES`` (default 128 MiB, 1 MiB..1 GiB), and its
sections "Unstructured parser isolation" (every PDF is heavy; documents over 8 MiB are heavy)
and "Canonical artifact retention bounds" (FIFO admission by count and estimated bytes; an
artifact charged at or above the budget runs alone; the materialization slot is handed off only
after the retained-artifact lease is acquired).

Two gates exist:

* **Materialization** (:func:`materialization_slot`): source read + parse. A heavy lane (capacity
  ``max(1, N - 1)``) is nested inside the main lane (capacity ``N``), so with ``N >= 2`` a light
  document always keeps a slot. Heavy documents take the heavy lane first, then the main lane:
  this fixed lock order cannot form a cycle.
* **Retained artifacts** (:func:`retained_artifact_gate`): a parse artifact held in memory through
  chunking, embedding and indexing, bounded by count and by the aggregate of
  :func:`~ingestion.retained_bytes.estimate_retained_bytes`. The caller acquires it *inside* its
  materialization slot and then leaves the slot; downstream work never reacquires
  materialization::

      with materialization_slot(is_heavy(mime, size), should_abort=canceled):
          artifact = parse(data)
          lease = retained_artifact_gate().acquire(
              estimate_retained_bytes(artifact, budget), should_abort=canceled
          )
      try:
          chunk_embed_index(artifact)
      finally:
          lease.release()

Batching
--------
A compiling wave parses its light documents one after another under one main-lane lease
(:func:`materialization_gate`): one thread parses one document at a time, so the lane's bound on
concurrent materializations is the same as with a lease per document, at two ledger transactions
per wave instead of two per document. Heavy documents keep a :func:`materialization_slot` each.
A wave gives its retained-artifact leases back together with :func:`release_all` (one ledger
transaction per gate). Retained leases are still acquired one by one: each charge is only known
once its document is parsed, and an artifact is never held without its lease.

Machine-wide
------------
django-q2 forks several worker processes, so a gate is a :class:`MachineSemaphore`: a ledger (JSON)
under ``settings.VAR_DIR / "locks"`` that is read and rewritten only while holding an exclusive
``fcntl.flock`` on a sibling ``.lock`` file. The ledger is replaced atomically (write + rename), so
a process killed mid-update leaves the previous ledger intact. Each holder and waiter is recorded
as ``(pid, process start time, charge bytes, ticket)``; the start time (``/proc/<pid>/stat``
field 22, clock ticks since boot) tells a live process from a later one that reused its pid.
Entries of dead processes (exited, SIGKILLed, zombies) are pruned by whoever touches the ledger
next, so a killed worker cannot leak a slot. The ledger also records the kernel's boot id and is
reset after a reboot.

"Machine" means the processes that share ``VAR_DIR`` *and* a PID namespace: the ledger's file name
carries the PID namespace id, because pids of another container are meaningless here (two
containers sharing a volume each get their own gates, as each has its own memory limit).

Fairness
--------
Strict FIFO by ticket: a blocking waiter joins the ledger's queue and is admitted only when it is
the oldest live waiter *and* it fits (count below capacity and, with a byte budget, the charges of
the current holders plus its own stay within the budget; a charge at or above the budget fits only
when there are no holders at all). A large charge at the head therefore holds back smaller ones
behind it rather than starving. A non-blocking acquire (``block=False``) never queues: it is
admitted only when no live waiter exists and it fits. Waiters poll with a backoff from 20 ms to
250 ms; a waiter whose process has not polled for :data:`WAITER_STALE_SECONDS` (e.g. a stopped
process) is dropped from the queue and re-queues at the back when it polls again.

Capacity and budget are the *acquiring* process's: processes configured differently each apply
their own limits to their own admissions.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import re
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings

logger = logging.getLogger("knowledgefs.gates")

#: Documents larger than this (bytes) take the heavy materialization lane ("over 8 MiB").
HEAVY_SOURCE_BYTES = 8 * 1024 * 1024
#: MIME types that always take the heavy lane: compressed PDF object streams make a bounded
#: page-count scan unreliable, so every PDF is heavy.
HEAVY_MIME_TYPES = frozenset({"application/pdf", "application/x-pdf"})

MATERIALIZATION_GATE = "document-materialization"
MATERIALIZATION_HEAVY_GATE = "document-materialization-heavy"
RETAINED_ARTIFACT_GATE = "document-retained-artifacts"

#: First and largest sleep (seconds) between admission attempts of a blocked waiter.
POLL_INITIAL_SECONDS = 0.02
POLL_MAX_SECONDS = 0.25
#: A waiter refreshes its ``seen`` time at most this often (seconds) ...
WAITER_HEARTBEAT_SECONDS = 5.0
#: ... and is dropped from the queue when it has not polled for this long (seconds).
WAITER_STALE_SECONDS = 60.0

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_LEDGER_VERSION = 1


class GateAborted(Exception):
    """Raised by a blocking :meth:`MachineSemaphore.acquire` (and :func:`materialization_slot`)
    when its ``should_abort`` callback returned true while waiting: the caller was not admitted
    and holds nothing from that call."""


# --- process identity -----------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time in clock ticks)`` of ``pid`` from ``/proc``, or ``None`` when the
    process does not exist. Raises ``OSError`` other than ``FileNotFoundError`` as is."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ..." — comm may contain spaces and parentheses.
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0].decode("ascii", "replace"), int(fields[19])


_HAS_PROC = os.path.exists("/proc/self/stat")


def _start_time(pid: int) -> int | None:
    """Start time of ``pid`` (clock ticks since boot) or ``None`` where ``/proc`` is missing."""
    if not _HAS_PROC:
        return None
    try:
        stat = _proc_stat(pid)
    except OSError:
        return None
    return stat[1] if stat else None


def _alive(pid: int, start: int | None) -> bool:
    """Whether the process recorded as ``(pid, start)`` still runs (zombies count as dead)."""
    if _HAS_PROC:
        try:
            stat = _proc_stat(pid)
        except OSError:
            return True  # cannot tell: keep the entry (never over-admit)
        if stat is None or stat[0] in ("Z", "X", "x"):
            return False
        return start is None or stat[1] == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        link = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    digits = "".join(ch for ch in link if ch.isdigit())
    return f"pidns-{digits}" if digits else ""


_BOOT_ID = _boot_id()
_PID_NAMESPACE = _pid_namespace()


# --- the semaphore ----------------------------------------------------------------------------


def _fits(holders: list[dict], charge: int, capacity: int, byte_budget: int | None) -> bool:
    """Admission rule: a free count slot and, with a budget, room for ``charge`` bytes; a charge
    at or above the budget fits only when nothing else is held (it runs alone)."""
    if len(holders) >= capacity:
        return False
    if byte_budget is None or not holders:
        return True
    if charge >= byte_budget:
        return False
    return sum(int(h["charge"]) for h in holders) + charge <= byte_budget


def _release(lock_path: str, ledger_path: str, ticket: int, pid: int) -> None:
    """Remove holder ``ticket`` from the ledger (run once per lease, by its finalizer). A child
    forked while the lease was held inherits the object but does not own the slot: no-op there."""
    if os.getpid() != pid:
        return
    try:
        with _locked_ledger(Path(lock_path), Path(ledger_path)) as ledger:
            ledger["holders"] = [h for h in ledger["holders"] if h["ticket"] != ticket]
    except Exception:  # pragma: no cover - release must never raise (finalizers, __exit__)
        logger.exception("could not release gate ticket %s in %s", ticket, ledger_path)


@contextmanager
def _locked_ledger(lock_path: Path, ledger_path: Path) -> Iterator[dict]:
    """Hold the gate's flock and yield its ledger (pruned of dead processes and stale waiters);
    the ledger is written back atomically on a clean exit when it changed."""
    lock_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            ledger = json.loads(ledger_path.read_text())
            if ledger.get("version") != _LEDGER_VERSION:
                raise ValueError(f"ledger version {ledger.get('version')!r}")
        except FileNotFoundError:
            ledger = None
        except (ValueError, OSError, AttributeError) as exc:
            logger.warning("resetting unreadable gate ledger %s: %s", ledger_path, exc)
            ledger = None
        if ledger is None or ledger.get("boot_id") != _BOOT_ID:
            ledger = {
                "version": _LEDGER_VERSION,
                "boot_id": _BOOT_ID,
                "next_ticket": 1,
                "holders": [],
                "waiters": [],
            }
        before = json.dumps(ledger, sort_keys=True)
        now = time.time()
        ledger["holders"] = [h for h in ledger["holders"] if _alive(h["pid"], h.get("start"))]
        ledger["waiters"] = [
            w
            for w in ledger["waiters"]
            if now - w.get("seen", now) < WAITER_STALE_SECONDS and _alive(w["pid"], w.get("start"))
        ]
        yield ledger
        after = json.dumps(ledger, sort_keys=True)
        if after != before:
            tmp = ledger_path.with_name(ledger_path.name + ".tmp")
            tmp.write_text(after)
            os.replace(tmp, ledger_path)
    finally:
        os.close(fd)  # releases the flock


class Lease:
    """A slot (and ``charge`` bytes) held in a :class:`MachineSemaphore`.

    ``release()`` is idempotent and never raises; the lease is also released when used as a
    context manager, when it is garbage-collected, and at normal interpreter exit. A process that
    dies without releasing loses its slot when the next acquirer prunes the ledger.

    Attributes:
        name: the gate's name.
        ticket: the ledger ticket (unique per gate until the ledger is reset).
        charge: bytes charged against the gate's budget.
        pid: the owning process.
    """

    def __init__(self, gate: MachineSemaphore, ticket: int, charge: int) -> None:
        self.name = gate.name
        self.ticket = ticket
        self.charge = charge
        self.pid = os.getpid()
        self._paths = (str(gate.lock_path), str(gate.ledger_path))
        self._finalizer = weakref.finalize(self, _release, *self._paths, ticket, self.pid)

    @property
    def released(self) -> bool:
        return not self._finalizer.alive

    def release(self) -> None:
        """Give the slot back (a no-op after the first call)."""
        self._finalizer()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<Lease {self.name} ticket={self.ticket} charge={self.charge} {state}>"


def release_all(leases: Iterable[Lease | None]) -> None:
    """Release several leases with one ledger transaction per gate instead of one per lease.

    Equivalent to calling :meth:`Lease.release` on each (``None`` and released leases are
    skipped, a lease of another process is left to its owner, nothing raises): a wave of
    compilation gives its retained-artifact leases back together, which saves a flock and a
    ledger rewrite per document. If the ledger cannot be written, each lease falls back to its
    own release.
    """
    pid = os.getpid()
    by_gate: dict[tuple[str, str], list[Lease]] = {}
    for lease in leases:
        if lease is not None and not lease.released and lease.pid == pid:
            by_gate.setdefault(lease._paths, []).append(lease)
    for (lock_path, ledger_path), group in by_gate.items():
        tickets = {lease.ticket for lease in group}
        try:
            with _locked_ledger(Path(lock_path), Path(ledger_path)) as ledger:
                ledger["holders"] = [h for h in ledger["holders"] if h["ticket"] not in tickets]
        except Exception:  # noqa: BLE001 - fall back to one release per lease
            logger.exception("could not release gate tickets %s in %s", tickets, ledger_path)
            for lease in group:
                lease.release()
            continue
        for lease in group:
            lease._finalizer.detach()  # released above: the finalizer must not run again


class MachineSemaphore:
    """A counting (and optionally byte-budgeted) semaphore shared by every process of the machine.

    Args:
        name: ledger name, ``[A-Za-z0-9_.-]{1,100}``; processes using the same name (and the same
            ``VAR_DIR`` and PID namespace) share the gate.
        capacity: maximum number of concurrent holders, ``>= 1``.
        byte_budget: maximum sum of holders' charges in bytes, ``>= 1``; ``None`` for a count-only
            gate (charges are then recorded but not limited).

    The ledger lives at ``settings.VAR_DIR / "locks" / f"{name}[.pidns-<id>].json"`` (lock file
    ``… .lock``), resolved when the semaphore is constructed. Admission is strict FIFO (see the
    module docstring).

    Raises:
        ValueError: an invalid name, capacity or budget.
    """

    def __init__(self, name: str, capacity: int, byte_budget: int | None = None) -> None:
        if not _NAME.match(name):
            raise ValueError(f"gate name {name!r} must match {_NAME.pattern}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"gate {name}: capacity must be an int >= 1, got {capacity!r}")
        if byte_budget is not None and (
            isinstance(byte_budget, bool) or not isinstance(byte_budget, int) or byte_budget < 1
        ):
            raise ValueError(f"gate {name}: byte_budget must be None or an int >= 1")
        self.name = name
        self.capacity = capacity
        self.byte_budget = byte_budget
        stem = f"{name}.{_PID_NAMESPACE}" if _PID_NAMESPACE else name
        directory = Path(settings.VAR_DIR) / "locks"
        self.lock_path = directory / f"{stem}.lock"
        self.ledger_path = directory / f"{stem}.json"

    def __repr__(self) -> str:
        return (
            f"<MachineSemaphore {self.name} capacity={self.capacity} "
            f"byte_budget={self.byte_budget}>"
        )

    def _locked(self):
        return _locked_ledger(self.lock_path, self.ledger_path)

    def acquire(
        self,
        charge: int = 0,
        *,
        block: bool = True,
        timeout: float | None = None,
        should_abort: Callable[[], bool] | None = None,
    ) -> Lease | None:
        """Take one slot charging ``charge`` bytes.

        Args:
            charge: bytes charged against ``byte_budget`` while held (``>= 0``); a charge at or
                above the budget is admitted only when the gate has no other holder.
            block: ``False`` makes one attempt that never queues: it succeeds only when no live
                waiter is queued and the charge fits, else returns ``None`` at once.
            timeout: with ``block=True``, give up (return ``None``) after this many seconds;
                ``None`` waits indefinitely.
            should_abort: polled before every admission attempt (so also before the first one),
                outside the ledger lock; when it returns true the wait ends with
                :class:`GateAborted`. A job canceled while queued thus never starts work.

        Returns:
            The :class:`Lease`, or ``None`` when not admitted (``block=False`` or timeout).

        Raises:
            GateAborted: ``should_abort()`` returned true; nothing is held.
            ValueError: a negative or non-int charge.
        """
        if isinstance(charge, bool) or not isinstance(charge, int) or charge < 0:
            raise ValueError(f"gate {self.name}: charge must be an int >= 0, got {charge!r}")
        pid, start = os.getpid(), _start_time(os.getpid())
        if not block:
            if should_abort is not None and should_abort():
                raise GateAborted(f"gate {self.name}: aborted before admission")
            with self._locked() as ledger:
                if ledger["waiters"] or not _fits(
                    ledger["holders"], charge, self.capacity, self.byte_budget
                ):
                    return None
                return self._admit(ledger, self._take_ticket(ledger), pid, start, charge)

        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        delay = POLL_INITIAL_SECONDS
        ticket: int | None = None
        lease: Lease | None = None
        try:
            while True:
                if should_abort is not None and should_abort():
                    raise GateAborted(f"gate {self.name}: aborted while queued")
                with self._locked() as ledger:
                    now = time.time()
                    mine = next((w for w in ledger["waiters"] if w["ticket"] == ticket), None)
                    if mine is None:  # first attempt, or dropped as stale: queue at the back
                        ticket = self._take_ticket(ledger)
                        mine = {"ticket": ticket, "pid": pid, "start": start, "charge": charge}
                        mine.update(since=now, seen=now)
                        ledger["waiters"].append(mine)
                    elif now - mine["seen"] >= WAITER_HEARTBEAT_SECONDS:
                        mine["seen"] = now
                    head = min(ledger["waiters"], key=lambda w: w["ticket"])
                    if head is mine and _fits(
                        ledger["holders"], charge, self.capacity, self.byte_budget
                    ):
                        ledger["waiters"].remove(mine)
                        lease = self._admit(ledger, mine["ticket"], pid, start, charge)
                        return lease
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    pause = min(delay, remaining)
                else:
                    pause = delay
                time.sleep(pause * random.uniform(0.9, 1.1))
                delay = min(delay * 1.5, POLL_MAX_SECONDS)
        finally:
            if lease is None and ticket is not None:
                with self._locked() as ledger:
                    ledger["waiters"] = [w for w in ledger["waiters"] if w["ticket"] != ticket]

    @staticmethod
    def _take_ticket(ledger: dict) -> int:
        ticket = int(ledger["next_ticket"])
        ledger["next_ticket"] = ticket + 1
        return ticket

    def _admit(self, ledger: dict, ticket: int, pid: int, start: int | None, charge: int) -> Lease:
        holder: dict[str, Any] = {"ticket": ticket, "pid": pid, "start": start, "charge": charge}
        holder["since"] = time.time()
        ledger["holders"].append(holder)
        return Lease(self, ticket, charge)

    def snapshot(self) -> dict[str, Any]:
        """The live ledger after pruning: ``{"holders": [...], "waiters": [...]}``, each entry a
        dict with ``ticket``, ``pid``, ``start``, ``charge`` (bytes) and ``since`` (epoch s)."""
        with self._locked() as ledger:
            return {"holders": list(ledger["holders"]), "waiters": list(ledger["waiters"])}


# --- the document-compilation gates ---------------------------------------------------------


def is_heavy(mime_type: str, size_bytes: int) -> bool:
    """Whether a source takes the heavy materialization lane: every PDF (``mime_type`` is compared
    without parameters, case-insensitively) and any document over :data:`HEAVY_SOURCE_BYTES`
    (8 MiB). ``size_bytes`` is the stored source size in bytes. Deployment guide, "Unstructured
    parser isolation"."""
    base = (mime_type or "").split(";", 1)[0].strip().lower()
    return base in HEAVY_MIME_TYPES or size_bytes > HEAVY_SOURCE_BYTES


def materialization_capacities() -> tuple[int, int]:
    """``(main, heavy)`` lane capacities from ``KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY``
    (``N``, 1..8): ``(N, max(1, N - 1))``, read at call time."""
    width = int(settings.KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY)
    return width, max(1, width - 1)


@contextmanager
def materialization_slot(
    heavy: bool, should_abort: Callable[[], bool] | None = None, *, block: bool = True
) -> Iterator[Lease | None]:
    """Hold a source-materialization slot (source read + parse) for the ``with`` body.

    A heavy document (:func:`is_heavy`) first takes the heavy lane (capacity ``max(1, N - 1)``),
    then the main lane (capacity ``N``); a light one takes only the main lane. Both waits block
    and are FIFO; both slots are released when the body exits, however it exits. Yields the
    main-lane :class:`Lease`. With ``block=False`` nothing waits: the body gets ``None`` when a
    lane is not free at once (a caller that already holds retained-artifact leases must never
    wait here, or two workers could each hold what the other waits for). Deployment guide,
    environment table, ``KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY``.

    Raises:
        GateAborted: ``should_abort()`` returned true while waiting (nothing is held then).
    """
    main, heavy_capacity = materialization_capacities()
    heavy_lease = None
    if heavy:
        heavy_lease = MachineSemaphore(MATERIALIZATION_HEAVY_GATE, heavy_capacity).acquire(
            block=block, should_abort=should_abort
        )
        if heavy_lease is None:
            yield None
            return
    try:
        lease = MachineSemaphore(MATERIALIZATION_GATE, main).acquire(
            block=block, should_abort=should_abort
        )
        if lease is None:
            yield None
            return
        with lease:
            yield lease
    finally:
        if heavy_lease is not None:
            heavy_lease.release()


def materialization_gate() -> MachineSemaphore:
    """The main materialization lane, capacity ``N`` (see :func:`materialization_capacities`).

    For a caller that materializes several *light* documents one after another under one lease:
    the lane bounds how many materializations run at once, and one thread parses one document
    at a time, so holding one slot across a sequence of light documents keeps the same bound
    (and holds the slot no shorter than per document would). Heavy documents (:func:`is_heavy`)
    must use :func:`materialization_slot`, which takes the heavy lane first; a caller holding
    this lease gives it back before it does, so the lock order stays heavy, then main."""
    return MachineSemaphore(MATERIALIZATION_GATE, materialization_capacities()[0])


def retained_artifact_gate() -> MachineSemaphore:
    """The gate for parse artifacts retained through chunking, embedding and indexing: capacity
    ``KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY`` (default 4, 1..32) and byte budget
    ``KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES`` (default 128 MiB, 1 MiB..1 GiB), read at
    call time. Charge each lease with :func:`~ingestion.retained_bytes.estimate_retained_bytes`
    (ceiling = the budget). Deployment guide, "Canonical artifact retention bounds"."""
    return MachineSemaphore(
        RETAINED_ARTIFACT_GATE,
        int(settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY),
        int(settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES),
    )
