"""Run the test passes of ``make test`` side by side (docs/testing.md, "Running the tests").

Usage: ``python scripts/run_passes.py [--serial] [--only LANE ...] [--skip TARGET ...] [--list]``
(``scripts/release_check.py --parallel`` runs its test steps through it).

Three lanes run at the same time, each a chain of Makefile targets run one after the other:

- ``sqlite``: ``make test-sqlite`` (the whole suite on the embedded default);
- ``postgres``: ``make test-postgres`` (the suite on a throw-away PostgreSQL);
- ``mariadb``: ``make test-mariadb`` (the migration suite on a throw-away MariaDB), then
  ``make eval-gate`` (the retrieval regression gate).

Each lane is isolated from the others: its own ``KNOWLEDGE_VAR_DIR`` (``var/passes/<lane>``:
the object store, the auth epoch, the SQLite test database, the keyword indexes, the gates
files), its own ``XDG_RUNTIME_DIR`` (gunicorn's control socket, the embedded PostgreSQL lock)
and its own ``TMPDIR`` (pytest's ``tmp_path`` base, whose numbered folders another pytest would
otherwise prune); side by side, ``KNOWLEDGE_EMBEDDING_THREADS`` and
``KNOWLEDGE_LOCAL_RERANK_THREADS`` default to half the cores (each model would otherwise run a
thread per core in each pass), unless set. The throw-away servers already take fresh data
folders and free ports (scripts/with_postgres.py, scripts/with_mariadb.py) and the eval gate
its own ``var/eval-gate``.

Each target's output goes to ``var/test-logs/<target>.log``; when a target ends one line is
printed, ``target → seconds → result`` (pytest's counts), and the tail of its log when it
failed. A lane stops at its first failed target. The exit status is 1 when any target failed.
``--serial`` runs the lanes one after the other (same isolation, same logs).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAKE = os.environ.get("MAKE", "make")
LANES: dict[str, tuple[str, ...]] = {
    "sqlite": ("test-sqlite",),
    "postgres": ("test-postgres",),
    "mariadb": ("test-mariadb", "eval-gate"),
}
# Side by side, the two long passes each get half the cores for the local embedding and
# reranking models (0, every core, by default: two passes would each spin on both), unless set.
THREAD_SETTINGS = ("KNOWLEDGE_EMBEDDING_THREADS", "KNOWLEDGE_LOCAL_RERANK_THREADS")
TARGETS = [target for targets in LANES.values() for target in targets]
TAIL_LINES = 80
# pytest -q's last line: "2 failed, 1200 passed, 31 skipped, 3 warnings in 1402.11s (0:23:22)"
SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in [\d.]+s")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")


@dataclass
class Result:
    target: str
    status: int
    seconds: float
    log: Path
    counts: str = ""


@dataclass
class Runner:
    var: Path = ROOT / "var"  # logs in var/test-logs, the lanes' var dirs in var/passes
    serial: bool = False
    results: list[Result] = field(default_factory=list)
    children: set[subprocess.Popen] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: bool = False

    def lane(self, name: str, targets: tuple[str, ...]) -> None:
        var_dir = self.var / "passes" / name
        shutil.rmtree(var_dir, ignore_errors=True)
        var_dir.mkdir(parents=True)
        # Short folders under /tmp: a Unix socket path has at most 107 bytes.
        runtime = Path(tempfile.mkdtemp(prefix=f"kfs-rt-{name[:2]}-"))
        scratch = Path(tempfile.mkdtemp(prefix=f"kfs-tmp-{name[:2]}-"))
        env = dict(
            os.environ,
            KNOWLEDGE_VAR_DIR=str(var_dir),
            XDG_RUNTIME_DIR=str(runtime),
            TMPDIR=str(scratch),
        )
        if not self.serial:  # the ONNX models' threads: a share of the cores, not every core
            for name in THREAD_SETTINGS:
                env.setdefault(name, str(max(1, (os.cpu_count() or 1) // 2)))
        try:
            for target in targets:
                if self.stopping or not self.target(target, env):
                    break
        finally:
            shutil.rmtree(runtime, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)

    def target(self, target: str, env: dict[str, str]) -> bool:
        log = self.var / "test-logs" / f"{target}.log"
        command = [MAKE, "--no-print-directory", "-o", ".venv/.installed", target]
        started = time.monotonic()
        with log.open("w") as out:
            out.write(f"$ {' '.join(command)}\n")
            out.flush()
            child = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, stopped as one on Ctrl-C
            )
            with self.lock:
                self.children.add(child)
            status = child.wait()
            with self.lock:
                self.children.discard(child)
        result = Result(target, status, time.monotonic() - started, log, summary(log))
        with self.lock:
            self.results.append(result)
            report(result)
        return status == 0

    def run(self, lanes: dict[str, tuple[str, ...]]) -> int:
        (self.var / "test-logs").mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        print(f"test passes: {', '.join(' → '.join(t) for t in lanes.values())}", flush=True)
        print(f"logs in {self.var / 'test-logs'}/<target>.log", flush=True)
        threads = [
            threading.Thread(target=self.lane, args=(name, targets), name=name)
            for name, targets in lanes.items()
        ]
        try:
            for thread in threads:
                thread.start()
                if self.serial:
                    thread.join()
            for thread in threads:
                thread.join()
        except KeyboardInterrupt:
            self.stop()
            raise
        failed = [r for r in self.results if r.status != 0]
        total = time.monotonic() - started
        verdict = f"{len(failed)} failed: {', '.join(r.target for r in failed)}" if failed else "ok"
        print(f"all passes → {total:.0f} s → {verdict}", flush=True)
        return 1 if failed else 0

    def stop(self) -> None:
        self.stopping = True
        with self.lock:
            children = list(self.children)
        for child in children:
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def summary(log: Path) -> str:
    """pytest's counts from the last summary line of ``log``, or "" when there is none."""
    lines = log.read_text(errors="replace").splitlines()
    for line in reversed(lines):
        match = SUMMARY.match(line.strip())
        if match:
            return ", ".join(f"{n} {word}" for n, word in COUNT.findall(match.group(1)))
    return ""


def report(result: Result) -> None:
    outcome = "ok" if result.status == 0 else f"FAILED (exit {result.status})"
    counts = f" ({result.counts})" if result.counts else ""
    print(f"{result.target} → {result.seconds:.0f} s → {outcome}{counts}", flush=True)
    if result.status != 0:
        tail = result.log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        print(f"--- last {len(tail)} lines of {result.log} ---", flush=True)
        print("\n".join(tail), flush=True)
        print(f"--- end of {result.log} ---", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial", action="store_true", help="one lane after the other")
    parser.add_argument("--only", action="append", choices=sorted(LANES), help="run this lane")
    parser.add_argument(
        "--skip", action="append", default=[], choices=TARGETS, help="leave this target out"
    )
    parser.add_argument("--var", type=Path, default=ROOT / "var", help="logs and lane folders")
    parser.add_argument("--list", action="store_true", help="print the lanes and exit")
    args = parser.parse_args(argv)
    lanes = {
        name: kept
        for name, targets in LANES.items()
        if (not args.only or name in args.only)
        and (kept := tuple(t for t in targets if t not in args.skip))
    }
    if args.list:
        for name, targets in lanes.items():
            print(f"{name}: {' → '.join(targets)}")
        return 0
    runner = Runner(var=args.var.resolve(), serial=args.serial)

    def terminate(signum: int, frame: object) -> None:
        runner.stop()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    return runner.run(lanes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
