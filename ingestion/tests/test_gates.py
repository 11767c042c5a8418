"""Machine-wide compilation gates (ingestion.memory_gates), exercised by real forked OS processes.

Every child records what it observed in its own file (``enter <t> <charge>`` after its acquire
returned, ``exit <t>`` before it released; ``t`` is ``time.monotonic()``, shared by all processes
on Linux). The recorded intervals lie inside the real holding intervals, so the concurrency
computed from them can only under-count: a maximum above the capacity is a real violation.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from ingestion import memory_gates
from ingestion.memory_gates import (
    GateAborted,
    MachineSemaphore,
    is_heavy,
    materialization_slot,
    retained_artifact_gate,
)
from ingestion.retained_bytes import estimate_retained_bytes

FORK = multiprocessing.get_context("fork")


@pytest.fixture(autouse=True)
def var_dir(settings, tmp_path):
    """Each test gets its own ledgers (forked children inherit the override)."""
    settings.VAR_DIR = tmp_path / "var"
    return settings.VAR_DIR


def wait_for(predicate, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def record(path: Path, line: str) -> None:
    with open(path, "a") as handle:
        handle.write(f"{line}\n")
        handle.flush()


def intervals(paths: list[Path]) -> list[tuple[float, float, int]]:
    """``(enter, exit, charge)`` of every completed hold recorded in ``paths``."""
    out = []
    for path in paths:
        start = charge = None
        for line in path.read_text().splitlines():
            kind, t, *rest = line.split()
            if kind == "enter":
                start, charge = float(t), int(rest[0]) if rest else 0
            elif kind == "exit":
                out.append((start, float(t), charge))
    return out


def peak(holds: list[tuple[float, float, int]]) -> tuple[int, int]:
    """Maximum number of overlapping holds and maximum overlapping charge."""
    events = sorted(
        [(s, 1, c) for s, _, c in holds] + [(e, 0, -c) for _, e, c in holds],
        key=lambda ev: (ev[0], ev[1]),  # at equal times an exit (0) counts before an enter (1)
    )
    count = charge = max_count = max_charge = 0
    for _, is_enter, delta in events:
        count += 1 if is_enter else -1
        charge += delta
        max_count, max_charge = max(max_count, count), max(max_charge, charge)
    return max_count, max_charge


def start(target, *args) -> multiprocessing.Process:
    process = FORK.Process(target=target, args=args)
    process.start()
    return process


def join_all(processes, timeout: float = 8.0) -> None:
    for process in processes:
        process.join(timeout)
        assert process.exitcode == 0, f"child {process.pid} exit code {process.exitcode}"


# --- children (run in forked processes) --------------------------------------------------------


def contend(name, capacity, budget, charge, hold, rounds, log):
    gate = MachineSemaphore(name, capacity, budget)
    for _ in range(rounds):
        with gate.acquire(charge) as lease:
            assert lease is not None
            record(log, f"enter {time.monotonic()} {charge}")
            time.sleep(hold)
            record(log, f"exit {time.monotonic()}")


def hold_until(name, capacity, budget, charge, log, go):
    """Acquire (blocking), record, hold until ``go`` exists, record, release."""
    lease = MachineSemaphore(name, capacity, budget).acquire(charge)
    record(log, f"enter {time.monotonic()} {charge}")
    while not go.exists():
        time.sleep(0.01)
    record(log, f"exit {time.monotonic()}")
    lease.release()


def wait_abortable(name, log, abort_flag):
    try:
        MachineSemaphore(name, 1).acquire(should_abort=abort_flag.exists)
    except GateAborted:
        record(log, f"aborted {time.monotonic()}")
        return
    record(log, f"enter {time.monotonic()}")


def materialize(heavy, log, go):
    with materialization_slot(heavy):
        record(log, f"enter {time.monotonic()}")
        while not go.exists():
            time.sleep(0.01)
        record(log, f"exit {time.monotonic()}")


# --- cross-process bounds -------------------------------------------------------------------


def test_processes_never_exceed_the_capacity(tmp_path):
    logs = [tmp_path / f"p{i}.log" for i in range(6)]
    children = [start(contend, "count-gate", 2, None, 0, 0.08, 3, log) for log in logs]
    join_all(children)
    holds = intervals(logs)
    assert len(holds) == 18
    max_count, _ = peak(holds)
    assert max_count == 2  # never above the capacity, and the capacity is actually used
    assert MachineSemaphore("count-gate", 2).snapshot() == {"holders": [], "waiters": []}


def test_processes_never_exceed_the_byte_budget(tmp_path):
    logs = [tmp_path / f"p{i}.log" for i in range(5)]
    # capacity 4 would allow four at once; the 100-byte budget allows two charges of 40
    children = [start(contend, "byte-gate", 4, 100, 40, 0.08, 2, log) for log in logs]
    join_all(children)
    holds = intervals(logs)
    assert len(holds) == 10
    max_count, max_charge = peak(holds)
    assert max_count == 2 and max_charge == 80


def test_a_sigkilled_holder_does_not_leak_its_slot(tmp_path):
    gate = MachineSemaphore("kill-gate", 1)
    log, never = tmp_path / "holder.log", tmp_path / "never"
    holder = start(hold_until, "kill-gate", 1, None, 0, log, never)
    wait_for(log.exists, what="the child to hold the slot")
    assert gate.acquire(block=False) is None
    [entry] = gate.snapshot()["holders"]
    assert entry["pid"] == holder.pid and entry["start"] is not None

    os.kill(holder.pid, signal.SIGKILL)
    # not joined yet: the killed child is a zombie until reaped, and still counts as dead
    lease = gate.acquire(timeout=5)
    assert lease is not None
    holder.join(5)
    assert holder.exitcode == -signal.SIGKILL
    lease.release()


def test_a_sigkilled_waiter_does_not_block_the_queue(tmp_path):
    gate = MachineSemaphore("dead-waiter", 1)
    lease = gate.acquire()
    waiter = start(hold_until, "dead-waiter", 1, None, 0, tmp_path / "w.log", tmp_path / "go")
    wait_for(lambda: len(gate.snapshot()["waiters"]) == 1, what="the child to queue")
    assert gate.acquire(block=False) is None  # full, and someone is queued
    os.kill(waiter.pid, signal.SIGKILL)
    waiter.join(5)
    lease.release()
    again = gate.acquire(block=False)
    assert again is not None
    assert gate.snapshot()["waiters"] == []
    again.release()


def test_an_over_budget_charge_waits_to_run_alone_and_is_admitted(tmp_path):
    gate = MachineSemaphore("budget-gate", 4, 100)
    small = gate.acquire(10)
    big_log, big_go = tmp_path / "big.log", tmp_path / "big.go"
    big = start(hold_until, "budget-gate", 4, 100, 500, big_log, big_go)
    wait_for(lambda: len(gate.snapshot()["waiters"]) == 1, what="the big charge to queue")
    time.sleep(0.3)
    assert not big_log.exists()  # 10 + 500 > 100: waits, does not deadlock
    assert gate.acquire(10, block=False) is None  # FIFO: the queued big charge goes first

    small.release()
    wait_for(big_log.exists, what="the big charge to be admitted alone")
    assert gate.acquire(0, block=False) is None  # it runs alone
    [entry] = gate.snapshot()["holders"]
    assert entry["charge"] == 500

    big_go.touch()
    join_all([big])
    after = gate.acquire(100, block=False)
    assert after is not None
    after.release()


def test_fifo_a_queued_waiter_goes_before_a_later_one(tmp_path):
    gate = MachineSemaphore("fifo-gate", 1)
    lease = gate.acquire()
    go = tmp_path / "go"
    first = start(hold_until, "fifo-gate", 1, None, 0, tmp_path / "first.log", go)
    wait_for(lambda: len(gate.snapshot()["waiters"]) == 1, what="the first waiter")
    second = start(hold_until, "fifo-gate", 1, None, 0, tmp_path / "second.log", go)
    wait_for(lambda: len(gate.snapshot()["waiters"]) == 2, what="the second waiter")
    go.touch()
    lease.release()
    join_all([first, second])
    [(first_in, first_out, _)] = intervals([tmp_path / "first.log"])
    [(second_in, _, _)] = intervals([tmp_path / "second.log"])
    assert first_in < first_out <= second_in


def test_non_blocking_acquire_returns_none_when_full(tmp_path):
    gate = MachineSemaphore("full-gate", 2)
    go = tmp_path / "go"
    holders = [
        start(hold_until, "full-gate", 2, None, 0, tmp_path / f"h{i}.log", go) for i in (0, 1)
    ]
    wait_for(lambda: len(gate.snapshot()["holders"]) == 2, what="two holders")
    started = time.monotonic()
    assert gate.acquire(block=False) is None
    assert time.monotonic() - started < 0.5
    assert gate.snapshot()["waiters"] == []  # a non-blocking attempt never queues
    assert gate.acquire(timeout=0.2) is None  # a timed-out wait leaves the queue too
    assert gate.snapshot()["waiters"] == []
    go.touch()
    join_all(holders)
    lease = gate.acquire(block=False)
    assert lease is not None
    lease.release()


def test_should_abort_makes_a_queued_waiter_give_up(tmp_path):
    gate = MachineSemaphore("abort-gate", 1)
    lease = gate.acquire()
    log, flag = tmp_path / "w.log", tmp_path / "canceled"
    waiter = start(wait_abortable, "abort-gate", log, flag)
    wait_for(lambda: len(gate.snapshot()["waiters"]) == 1, what="the waiter to queue")
    flag.touch()
    join_all([waiter])
    assert log.read_text().startswith("aborted")
    snapshot = gate.snapshot()
    assert snapshot["waiters"] == [] and len(snapshot["holders"]) == 1
    lease.release()
    # already canceled: never admitted, even with a free slot
    with pytest.raises(GateAborted):
        gate.acquire(should_abort=lambda: True)
    with pytest.raises(GateAborted):
        gate.acquire(block=False, should_abort=lambda: True)
    assert gate.snapshot() == {"holders": [], "waiters": []}


# --- materialization lanes and the retained-artifact handoff ----------------------------------


def test_heavy_lane_admits_one_pdf_at_a_time_while_text_proceeds(settings, tmp_path):
    settings.KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY = 2
    assert memory_gates.materialization_capacities() == (2, 1)
    go1, go2, go_text = tmp_path / "go1", tmp_path / "go2", tmp_path / "go-text"
    pdf1 = start(materialize, True, tmp_path / "pdf1.log", go1)
    wait_for((tmp_path / "pdf1.log").exists, what="the first PDF")
    pdf2 = start(materialize, True, tmp_path / "pdf2.log", go2)
    heavy = MachineSemaphore(memory_gates.MATERIALIZATION_HEAVY_GATE, 1)
    wait_for(lambda: len(heavy.snapshot()["waiters"]) == 1, what="the second PDF to queue")
    text = start(materialize, False, tmp_path / "text.log", go_text)
    wait_for((tmp_path / "text.log").exists, what="the text document beside the first PDF")
    assert not (tmp_path / "pdf2.log").exists()

    go_text.touch()
    go2.touch()
    go1.touch()
    join_all([pdf1, pdf2, text])
    [(_, pdf1_out, _)] = intervals([tmp_path / "pdf1.log"])
    [(pdf2_in, _, _)] = intervals([tmp_path / "pdf2.log"])
    assert pdf2_in >= pdf1_out


def test_with_one_materialization_slot_the_heavy_lane_is_one(settings):
    settings.KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY = 1
    assert memory_gates.materialization_capacities() == (1, 1)
    settings.KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY = 8
    assert memory_gates.materialization_capacities() == (8, 7)


def test_materialization_slot_releases_both_lanes_on_error_and_abort(settings):
    settings.KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY = 2
    main = MachineSemaphore(memory_gates.MATERIALIZATION_GATE, 2)
    heavy = MachineSemaphore(memory_gates.MATERIALIZATION_HEAVY_GATE, 1)
    with pytest.raises(RuntimeError), materialization_slot(True):
        assert len(main.snapshot()["holders"]) == len(heavy.snapshot()["holders"]) == 1
        raise RuntimeError("parse failed")
    assert main.snapshot()["holders"] == heavy.snapshot()["holders"] == []

    blockers = [main.acquire(), main.acquire()]
    with pytest.raises(GateAborted), materialization_slot(True, should_abort=lambda: True):
        pass
    assert heavy.snapshot() == {"holders": [], "waiters": []}
    for lease in blockers:
        lease.release()


def test_the_materialization_slot_is_handed_off_after_the_retained_lease(settings):
    settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY = 4
    settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES = 1024 * 1024
    retained = retained_artifact_gate()
    assert (retained.capacity, retained.byte_budget) == (4, 1024 * 1024)
    main = MachineSemaphore(memory_gates.MATERIALIZATION_GATE, 2)
    with materialization_slot(False):
        artifact = [{"type": "paragraph", "text": "word " * 1000}]
        lease = retained.acquire(estimate_retained_bytes(artifact, retained.byte_budget))
        assert len(main.snapshot()["holders"]) == 1
    assert main.snapshot()["holders"] == []  # materialization given back ...
    [entry] = retained.snapshot()["holders"]  # ... while the artifact is still accounted
    assert entry["charge"] > 10_000
    lease.release()
    lease.release()  # idempotent
    assert lease.released and retained.snapshot()["holders"] == []


def test_leases_release_when_dropped_and_validate_arguments():
    gate = MachineSemaphore("drop-gate", 1)
    gate.acquire()  # not kept: released when garbage-collected
    lease = gate.acquire(block=False)
    assert lease is not None
    with lease:
        pass
    assert lease.released
    with pytest.raises(ValueError):
        gate.acquire(-1)
    with pytest.raises(ValueError):
        MachineSemaphore("bad/name", 1)
    with pytest.raises(ValueError):
        MachineSemaphore("x", 0)
    with pytest.raises(ValueError):
        MachineSemaphore("x", 1, byte_budget=0)


def test_is_heavy():
    assert is_heavy("application/pdf", 10)
    assert is_heavy("Application/PDF; charset=binary", 0)
    assert not is_heavy("text/plain", 8 * 1024 * 1024)
    assert is_heavy("text/plain", 8 * 1024 * 1024 + 1)
    assert not is_heavy("text/markdown", 1000)


# --- the retained-byte estimate ---------------------------------------------------------------


def test_estimate_charges_more_for_more_text():
    small = estimate_retained_bytes({"text": "a" * 100}, 10**9)
    large = estimate_retained_bytes({"text": "a" * 1000}, 10**9)
    assert large - small == 2 * 900  # UTF-16: two bytes per code unit
    assert estimate_retained_bytes("😀", 10**9) == estimate_retained_bytes("ab", 10**9)
    assert estimate_retained_bytes("é", 10**9) == estimate_retained_bytes("e", 10**9)
    assert estimate_retained_bytes([1, 2.5, None, True], 10**9) > estimate_retained_bytes([], 10**9)
    assert estimate_retained_bytes(None, 10**9) == 0


def test_estimate_walks_parser_elements():
    from ingestion.parsing.base import Element

    one = [Element(type="paragraph", text="x" * 500, metadata={"quote": True})]
    two = one + [Element(type="paragraph", text="y" * 500)]
    a, b = estimate_retained_bytes(one, 10**9), estimate_retained_bytes(two, 10**9)
    assert a > 1000 and b > a + 1000
    assert dataclasses.is_dataclass(one[0])


def test_estimate_stops_at_the_ceiling():
    assert estimate_retained_bytes("x" * 5_000_000, 1000) == 1000
    assert estimate_retained_bytes({"a": ["x" * 10] * 1000}, 500) == 500
    cycle: list = []
    cycle.append(cycle)
    assert estimate_retained_bytes(cycle, 4096) == 4096  # an endless graph still terminates
    huge = ["x" * 100] * 2_000_000
    started = time.monotonic()
    assert estimate_retained_bytes(huge, 1024 * 1024) == 1024 * 1024
    assert time.monotonic() - started < 1.0
    with pytest.raises(ValueError):
        estimate_retained_bytes("x", -1)
