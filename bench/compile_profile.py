"""Where compilation's non-model time goes: cProfile, SQL statements and gate-ledger operations.

Admits the first ``--docs`` SciFact records (title + abstract as one ``.txt`` each, as in
``bench/compile_overhead.py``) into a fresh space, then compiles them once with ``drain_queued``
(the worker's code path without the queue) under three instruments at the same time:

* ``cProfile``: cumulative time per function; the model's share is the time inside
  ``embed_documents``, everything else is the pipeline's own overhead.
* ``CaptureQueriesContext`` on the compiling thread's connection: SQL statements by kind
  (first words of the statement and its table), in total and per document. The lease keeper
  thread has its own connection and is not counted (it writes once per lease third).
* Gate-ledger operations: every flock'd read-modify-write of a ledger (``_locked_ledger``) and
  every ledger rewrite (``os.replace`` of a ``locks/*.json``), per gate.

Writes a JSON report (``--out``) and prints a table. ``KNOWLEDGE_VAR_DIR`` must point at an
empty folder. Run it from any checkout to compare versions.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import gzip
import io
import json
import os
import pstats
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")

#: Rows of the breakdown: label → (file suffix, function); cumulative seconds under cProfile.
#: The rows overlap where one calls another (noted in the label); "model" is inside "project".
BREAKDOWN = {
    "model (embed_documents)": ("runtime/local_embedding.py", "embed_documents"),
    "embed + index stage (_project, incl. model)": ("compilation/embed_step.py", "_project"),
    "lease renewal + progress (Held.beat)": ("compilation/leases.py", "beat"),
    "lease re-read (Held.refresh)": ("compilation/leases.py", "refresh"),
    "attempt counter (Held.start)": ("compilation/leases.py", "start"),
    "gate acquire (MachineSemaphore.acquire)": ("ingestion/memory_gates.py", "acquire"),
    "gate release, batched (release_all)": ("ingestion/memory_gates.py", "release_all"),
    "gate release (_release)": ("ingestion/memory_gates.py", "_release"),
    "parse (_parse)": ("compilation/parse_step.py", "_parse"),
    "chunk (_generate_nodes)": ("compilation/generations.py", "_generate_nodes"),
    "stage commits (_commit, incl. node/vector/FTS writes)": (
        "compilation/stage_commit.py",
        "_commit",
    ),
    "publish (publish_many)": ("compilation/publish.py", "publish_many"),
    "claim (claim_many)": ("compilation/leases.py", "claim_many"),
}

_TABLE = re.compile(r'(?:FROM|INTO|UPDATE)\s+"?([a-z_0-9]+)"?', re.IGNORECASE)


def statement_kind(sql: str) -> str:
    """``"UPDATE ingestion_compilationjob"``-style label of one SQL statement."""
    words = sql.strip().split(None, 1)
    verb = words[0].upper() if words else "?"
    if verb in {"SAVEPOINT", "RELEASE", "ROLLBACK", "BEGIN", "COMMIT"}:
        return verb
    match = _TABLE.search(sql)
    return f"{verb} {match.group(1) if match else '?'}"


@contextlib.contextmanager
def count_ledger_operations():
    """Count ``_locked_ledger`` entries and ledger rewrites per gate while the body runs."""
    from ingestion import memory_gates

    opened: collections.Counter = collections.Counter()
    rewritten: collections.Counter = collections.Counter()
    original_locked = memory_gates._locked_ledger
    original_replace = os.replace

    @contextlib.contextmanager
    def locked(lock_path, ledger_path):
        opened[Path(ledger_path).name.split(".")[0]] += 1
        with original_locked(lock_path, ledger_path) as ledger:
            yield ledger

    def replace(src, dst, *args, **kwargs):
        if str(dst).endswith(".json") and "locks" in str(dst):
            rewritten[Path(dst).name.split(".")[0]] += 1
        return original_replace(src, dst, *args, **kwargs)

    memory_gates._locked_ledger = locked
    os.replace = replace
    try:
        yield opened, rewritten
    finally:
        memory_gates._locked_ledger = original_locked
        os.replace = original_replace


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--out", default=None)
    parser.add_argument("--top", type=int, default=40, help="profile rows to print")
    parser.add_argument("--pstats", default=None, help="also dump the raw profile here")
    args = parser.parse_args()
    corpus = Path(args.dataset) / "corpus.jsonl.gz"
    if not corpus.exists():
        print(f"dataset not found: {corpus}", file=sys.stderr)
        return 2

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from ingestion.compilation.recovery import drain_queued
    from ingestion.documents import admit_document
    from knowledgefs.runtime import get_embedding_model

    try:
        from knowledgefs.auth.principal import Principal
    except ImportError:  # older checkouts
        from spaces.services import Principal
    from spaces.services import create_space

    call_command("migrate", verbosity=0)
    records = []
    with gzip.open(corpus, "rt", encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            records.append((row["_id"], f"{row.get('title', '')}\n\n{row['text']}"))
            if len(records) == args.docs:
                break
    model = get_embedding_model()
    model.embed_documents(["warm-up"] * 16)
    space = create_space(Principal(tenant_id="bench"), name=f"profile {time.time()}")
    for doc_id, text in records:
        admit_document(space, filename=f"{doc_id}.txt", data=text.encode(), enqueue=False)

    profiler = cProfile.Profile()
    with count_ledger_operations() as (opened, rewritten):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            profiler.enable()
            drain_queued(space.id)
            profiler.disable()
            wall = time.perf_counter() - started
    n = len(records)
    if args.pstats:
        profiler.dump_stats(args.pstats)
    stats = pstats.Stats(profiler)
    cumulative = collections.Counter()
    calls = collections.Counter()
    for (filename, _line, name), row in stats.stats.items():
        for label, (module, function) in BREAKDOWN.items():
            if name == function and filename.endswith(module):
                cumulative[label] += row[3]
                calls[label] += row[1]
    model_seconds = cumulative["model (embed_documents)"]
    kinds = collections.Counter(statement_kind(q["sql"]) for q in queries.captured_queries)
    sql_seconds = sum(float(q["time"]) for q in queries.captured_queries)
    buffer = io.StringIO()
    pstats.Stats(profiler, stream=buffer).sort_stats("cumulative").print_stats(args.top)
    result = {
        "docs": n,
        "compile_seconds_profiled": round(wall, 2),
        "model_seconds": round(model_seconds, 2),
        "other_seconds": round(wall - model_seconds, 2),
        "other_ms_per_doc": round(1000 * (wall - model_seconds) / n, 1),
        "breakdown_seconds": {k: round(cumulative[k], 2) for k in BREAKDOWN},
        "breakdown_calls": {k: calls[k] for k in BREAKDOWN},
        "sql_statements": len(queries.captured_queries),
        "sql_statements_per_doc": round(len(queries.captured_queries) / n, 2),
        "sql_seconds": round(sql_seconds, 2),
        "sql_by_kind": dict(kinds.most_common()),
        "ledger_transactions": dict(opened),
        "ledger_transactions_per_doc": round(sum(opened.values()) / n, 2),
        "ledger_rewrites": dict(rewritten),
        "ledger_rewrites_per_doc": round(sum(rewritten.values()) / n, 2),
    }
    print(buffer.getvalue())
    print(json.dumps(result, indent=2))
    if args.out:
        result["profile_top"] = buffer.getvalue().splitlines()
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
