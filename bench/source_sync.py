"""A sync of 1,000 online-document pages with 1 % changed, against the simulated Dify.

1. A fresh SQLite state directory (``--var``, default a temporary one), migrated; one space and
   one ``online_document`` source on the simulated Dify's fake provider
   (``knowledgefs/testing/dify_datasource.py``), run in this process on loopback, with
   ``--items`` pages of a few hundred bytes each.
2. Import: every page, in runs of 200 items (the route's limit), each delivered in this process
   by the worker's entry point (:func:`ingestion.sources.runner.run_delivery`). Compilation is
   not run: the documents' jobs stay queued (the benchmark measures the datasource side).
3. ``--changed`` pages (1 % by default) get new content; one sync run is timed: wall time, the
   provider's requests per operation, the documents read again, the compilation jobs created.
4. A second sync with nothing changed is timed the same way.

Writes ``bench/results/source-sync-DATE.json`` (or ``--out``) and prints a summary.

Usage: ``python bench/source_sync.py [--items 1000] [--changed 10]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--changed", type=int, default=10)
    parser.add_argument("--var", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    var = args.var or Path(tempfile.mkdtemp(prefix="kfs-source-sync-"))
    var.mkdir(parents=True, exist_ok=True)

    from knowledgefs.testing.dify_datasource import WORKSPACE, Item
    from knowledgefs.testing.dify_server import TEST_INNER_KEY, DifyTestServer

    dify = DifyTestServer().start()
    os.environ.update(
        DJANGO_SETTINGS_MODULE="knowledgefs.settings",
        KNOWLEDGE_VAR_DIR=str(var),
        DIFY_INNER_API_URL=dify.url,
        DIFY_INNER_API_KEY=TEST_INNER_KEY,
    )
    import django

    django.setup()
    from django.core.management import call_command

    from ingestion.models import CompilationJob
    from ingestion.sources import runner, runs
    from ingestion.sources.models import Source, SourceRun
    from spaces.services import Principal, create_space

    call_command("migrate", verbosity=0)
    tenant = "kfs-bench"
    space = create_space(Principal(tenant_id=tenant), name="Source sync")
    provider = dify.provider
    provider.credentials = {"cred-bench": tenant}
    for n in range(args.items):
        provider.pages[f"p-{n:05d}"] = Item(
            f"Page {n}",
            f"# Page {n}\n\nPage {n} of the bench wiki, about topic {n % 97}.\n".encode(),
        )
    source = Source.objects.create(
        tenant_id=tenant, space=space, name="Bench wiki", kind="online_document",
        provider="langgenius/notion_datasource/notion", datasource="notion",
        credential_id="cred-bench",
    )  # fmt: skip

    def deliver(run: SourceRun) -> tuple[str, float]:
        # the run was claimed and its message published when its creation committed
        task_id = SourceRun.objects.get(id=run.id).task_id
        started = time.perf_counter()
        outcome = runner.run_delivery(str(run.id), task_id)
        return outcome, time.perf_counter() - started

    result: dict = {"date": dt.date.today().isoformat(), "items": args.items}
    ids = sorted(provider.pages)
    import_seconds = 0.0
    for start in range(0, len(ids), runs.MAX_ITEMS):
        chunk = ids[start : start + runs.MAX_ITEMS]
        items = [{"page_id": p, "workspace_id": WORKSPACE} for p in chunk]
        outcome, seconds = deliver(runs.start_import(source, {"items": items}))
        assert outcome == "completed", outcome
        import_seconds += seconds
    result["import"] = {
        "seconds": round(import_seconds, 2),
        "requests": dict(provider.calls),
        "documents": CompilationJob.objects.count(),
    }

    for label, changed in (("sync_1pct_changed", args.changed), ("sync_unchanged", 0)):
        for n in range(changed):
            provider.change(
                "pages", ids[n * (len(ids) // max(1, changed))], f"# New {n}\n\nEdited.\n".encode()
            )
        provider.calls.clear()
        provider.item_calls.clear()
        jobs = CompilationJob.objects.count()
        run = runs.start_sync(source)
        outcome, seconds = deliver(run)
        run.refresh_from_db()
        result[label] = {
            "outcome": outcome,
            "seconds": round(seconds, 2),
            "requests": dict(provider.calls),
            "requests_total": sum(provider.calls.values()),
            "pages_read_again": len(provider.item_calls),
            "jobs_created": CompilationJob.objects.count() - jobs,
            "progress": [
                run.progress_total,
                run.progress_completed,
                run.progress_skipped,
                run.progress_failed,
            ],  # fmt: skip
        }
    dify.stop()
    out = args.out or ROOT / "bench" / "results" / f"source-sync-{result['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
