"""Replay benchmark: golden questions replayed on a large space by a real worker cluster that is
SIGKILLed mid-run (docs/benchmarks.md, "Replay runs"; docs/quality.md).

On the embedded default (SQLite in ``KNOWLEDGE_VAR_DIR``, local object files, the local ONNX
embedding model) this compiles generated documents in this process until the space holds
``--chunks`` chunks (one fact per section, each section one chunk at
``KNOWLEDGE_CHUNK_TARGET_CHARS``), creates ``--questions`` active golden questions (each asks for
one section's fact, its expected evidence the fact's sentence), then starts ``manage.py
qcluster`` as a child process group and creates one replay run of every active question (the
real claim-before-enqueue dispatch). When ``--kill-at`` of the items are finished it SIGKILLs the
whole cluster, plays the every-minute sweep (the stale run goes back to ``queued``), starts a new
cluster and waits for the run to end.

Asserted (exit status 1 otherwise): every question has exactly one item, every item finished,
the items finished before the kill untouched by the resumed delivery (same ``completed_at`` and
result), two deliveries. Printed (and written to ``--out``): throughput (items per second of
each cluster's working time and over the whole run), per-item retrieval time (p50/p95/max of
``metrics.total_ms``), the time from the kill to the first item finished by the new cluster, the
pass rate.

Usage (own state directory; about 10 minutes on two shared cores)::

    KNOWLEDGE_VAR_DIR=/work/bench-var-replay nice -n 10 .venv/bin/python bench/replay.py \
        [--chunks 10000] [--questions 1000] [--kill-at 0.4] [--out bench/results/FILE.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")

TENANT = "kfs-replay-bench"
SECTIONS_PER_DOCUMENT = 50
STALE_SECONDS = 5  # the smallest stale time the settings accept: the sweep takes the run back
SYLLABLES = ["ba", "ko", "tu", "ri", "sa", "me", "lo", "ni", "pe", "da", "gu", "fi", "zo", "ve"]
FILLER = (
    "The cabinet is inspected every quarter by the facilities team.",
    "Access requires a badge issued by the front desk.",
    "Records are kept for seven years in the archive room.",
    "Spills are reported to the safety officer within one hour.",
    "Labels follow the house style guide for hazardous goods.",
    "The inventory is reconciled at the end of each month.",
)


def name_of(n: int) -> str:
    """A distinct pronounceable word per fact (keyword and dense legs can tell them apart)."""
    word = ""
    for _ in range(4):
        n, r = divmod(n, len(SYLLABLES))
        word += SYLLABLES[r]
    return word + SYLLABLES[n % len(SYLLABLES)]


def fact(n: int) -> tuple[str, str, str]:
    """``(section text, question, expected sentence)`` of fact ``n``."""
    rng = random.Random(n)
    name = name_of(n)
    degrees, shelf = rng.randint(-40, 30), rng.randint(1, 99)
    sentence = f"Compound {name} is stored at {degrees} degrees on shelf {shelf}."
    filler = " ".join(rng.sample(FILLER, 3))
    return (
        f"## Compound {name}\n\n{sentence} {filler}",
        f"At what temperature is compound {name} stored?",
        sentence,
    )


def build_space(chunks: int, questions: int):
    """A space compiled in this process to at least ``chunks`` chunks, with ``questions``
    active golden questions spread over it."""
    from ingestion.compilation.recovery import drain_queued as compile_all
    from ingestion.documents import admit_document
    from ingestion.models import KnowledgeNode
    from retrieval.golden import create_question
    from spaces.services import Principal, create_space

    space = create_space(Principal(tenant_id=TENANT), name=f"replay bench {time.time():.0f}")
    started = time.perf_counter()
    n = doc = 0
    while KnowledgeNode.objects.filter(space=space).count() < chunks:
        for _ in range(20):
            body = "\n\n".join(fact(n + i)[0] for i in range(SECTIONS_PER_DOCUMENT))
            data = f"# Compounds {doc}\n\n{body}\n".encode()
            admit_document(space, filename=f"compounds-{doc:04d}.md", data=data, enqueue=False)
            n += SECTIONS_PER_DOCUMENT
            doc += 1
        compile_all()
    node_count = KnowledgeNode.objects.filter(space=space).count()
    compile_s = time.perf_counter() - started
    step = max(n // questions, 1)
    for q in range(questions):
        _section, question, sentence = fact(q * step)
        create_question(space, {"question": question, "expected_evidence": [{"text": sentence}]})
    return space, {"documents": doc, "facts": n, "chunks": node_count,
                   "compile_seconds": round(compile_s, 1)}  # fmt: skip


class Cluster:
    """``manage.py qcluster`` in its own process group (SIGKILL takes every process of it)."""

    def __init__(self, env: dict, log: Path) -> None:
        self.env, self.log, self.process = env, log, None

    def start(self) -> Cluster:
        from django.db import connections

        connections.close_all()
        with open(self.log, "ab") as handle:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=self.env,
                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        return self

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def done_count(run) -> int:
    from retrieval.models import ReplayItem

    return ReplayItem.objects.filter(run=run).exclude(state="pending").count()


def wait(condition, seconds: float, every: float = 0.2, sweep=None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if sweep is not None:
            sweep()
        time.sleep(every)
    return None


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))], 2)


def replay_under_kill(space, questions: int, kill_at: float, env: dict, log: Path) -> dict:
    from retrieval.models import ReplayItem, ReplayRun
    from retrieval.quality import replay, replay_dispatch
    from spaces.services import Principal

    first = Cluster(env, log).start()
    time.sleep(3)  # the cluster's workers up before the message arrives
    t0 = time.monotonic()
    run, _ = replay.create_run(
        Principal(tenant_id=TENANT), space, {"selection": "all-active"}
    )  # dispatched at once: autocommit, so the on-commit callback runs now
    target = max(1, int(questions * kill_at))
    try:
        if not wait(lambda: done_count(run) >= target, 1800):
            raise SystemExit(f"the first cluster finished too few items: {done_count(run)}")
    finally:
        first.kill()
    killed_at = time.monotonic()
    first_span = killed_at - t0
    finished = {
        i.ordinal: (i.completed_at, i.result)
        for i in ReplayItem.objects.filter(run=run).exclude(state="pending")
    }
    state_after_kill = ReplayRun.objects.get(id=run.id).state
    second = Cluster(env, log).start()
    try:
        requeued = wait(
            lambda: ReplayRun.objects.get(id=run.id).attempt_count >= 2,
            300,
            sweep=replay_dispatch.QUEUE.sweep,
        )
        resumed_at = wait(lambda: done_count(run) > len(finished) and time.monotonic(), 300)
        ended = wait(lambda: ReplayRun.objects.get(id=run.id).state in ReplayRun.TERMINAL, 3600)
    finally:
        second.stop()
    end = time.monotonic()
    run.refresh_from_db()
    items = list(ReplayItem.objects.filter(run=run).order_by("ordinal"))
    checks = {
        "run_ended": bool(ended),
        "one_item_per_question": len(items) == questions
        and [i.ordinal for i in items] == list(range(1, questions + 1))
        and len({i.golden_question_id for i in items}) == questions,
        "every_item_finished": all(i.state != "pending" for i in items),
        "finished_items_not_rerun": all(
            (i.completed_at, i.result) == finished[i.ordinal]
            for i in items
            if i.ordinal in finished
        ),
        "two_deliveries": run.attempt_count == 2 and bool(requeued),
        "running_after_kill": state_after_kill == "running",
    }
    per_item = [i.metrics.get("total_ms", 0.0) for i in items if i.metrics]
    second_items = len(items) - len(finished)
    second_span = end - (resumed_at or end)
    return {
        "checks": checks,
        "run": {
            "id": str(run.id),
            "state": run.state,
            "summary": run.summary,
            "attempt_count": run.attempt_count,
        },  # fmt: skip
        "items_before_kill": len(finished),
        "throughput_items_per_s": {
            "first_cluster": round(len(finished) / first_span, 2),
            "second_cluster": round(second_items / second_span, 2) if second_span > 0 else None,
            "whole_run_including_recovery": round(len(items) / (end - t0), 2),
        },
        "per_item_ms": {
            "p50": percentile(per_item, 50),
            "p95": percentile(per_item, 95),
            "max": round(max(per_item), 2),
        },  # fmt: skip
        "kill_to_first_resumed_item_s": round(resumed_at - killed_at, 1) if resumed_at else None,
        "wall_s": round(end - t0, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10000)
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--kill-at", type=float, default=0.4, help="share of items done")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk-chars", type=int, default=400, help="chunk target (chars)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if "KNOWLEDGE_VAR_DIR" not in os.environ:
        print("set KNOWLEDGE_VAR_DIR to a state directory of your own", file=sys.stderr)
        return 2
    os.environ["KNOWLEDGE_QUALITY_REPLAY_STALE_SECONDS"] = str(STALE_SECONDS)
    os.environ["KNOWLEDGE_WORKERS"] = str(args.workers)
    os.environ["KNOWLEDGE_CHUNK_TARGET_CHARS"] = str(args.chunk_chars)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    var_dir = Path(settings.VAR_DIR)
    stamp = dt.datetime.now().strftime("%Y%m%d%H%M%S")
    log = var_dir / f"replay-bench-{stamp}-qcluster.log"
    env = {**os.environ, "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING")}
    space, corpus = build_space(args.chunks, args.questions)
    print(f"space: {json.dumps(corpus)}", flush=True)
    result = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "config": {
            "database": str(settings.DATABASES["default"]["ENGINE"]),
            "workers": args.workers,
            "chunk_target_chars": args.chunk_chars,
            "questions": args.questions,
            "kill_at": args.kill_at,
            "stale_seconds": STALE_SECONDS,
            "nice": os.nice(0),
        },  # fmt: skip
        "space": corpus,
        **replay_under_kill(space, args.questions, args.kill_at, env, log),
        "cluster_log": str(log),
    }
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    failed = [name for name, ok in result["checks"].items() if not ok]
    if failed:
        print(f"FAILED checks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
