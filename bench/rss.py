"""Worker memory: peak RSS of a process compiling the largest sample documents, per budget.

For each budget of the retained-artifact gate (the default: 4 artifacts, 128 MiB; a tight one:
1 artifact, 1 MiB) and each document set, a fresh state directory is set up (migrate, one
space, the files admitted without a queue message) by one child process; a second, fresh child
then compiles them with ``drain_queued`` (what ``kfs ingest --wait`` runs) and its peak RSS is
read from ``os.wait4`` (``ru_maxrss``) and ``/proc/<pid>/status`` (``VmHWM``). A third child
computes the gate's charge for each document's parse artifact,
``estimate_retained_bytes(artifact.elements, budget)``, and a fourth embeds the very chunk texts
again with the model alone (same batches of 8), which separates the model runtime's working set
from what compilation keeps besides. Baselines are fresh processes that load Django and the
embedding model and nothing else, once without and once with a single embedding batch of eight
texts cut at the model's 256 word pieces.

Document sets:

* ``sample``: the ``--n`` largest files under ``../shared/data`` whose sniffed type the service
  accepts (PDF, DOCX, HTML, TXT, Markdown, CSV).
* ``large``: ``--large`` plain-text files of about ``--large-bytes`` each, built from disjoint
  runs of SciFact abstracts (real text; the sample files are far below the budgets).

Usage::

    KNOWLEDGE_VAR_DIR=/path/of/your/own python bench/rss.py [--n 8] [--large 4]
        [--large-bytes 1048576] [--out bench/results/FILE.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")

MIB = 1024 * 1024
BUDGETS = {
    "default": {"concurrency": 4, "bytes": 128 * MIB},
    "tight": {"concurrency": 1, "bytes": 1 * MIB},
}
TENANT, SLUG = "kfs-rss", "rss"


# --- children -------------------------------------------------------------------------------


def child_setup(files: list[str]) -> dict:
    import django

    django.setup()
    from django.core.management import call_command

    from ingestion.documents import admit_document
    from spaces import services as spaces

    call_command("migrate", verbosity=0)
    space = spaces.create_space(spaces.Principal(tenant_id=TENANT), name="rss", slug=SLUG)
    admitted = []
    for name in files:
        path = Path(name)
        admission = admit_document(space, filename=path.name, data=path.read_bytes(), enqueue=False)
        admitted.append({"file": path.name, "mime_type": admission.document.mime_type})
    return {"admitted": admitted}


def child_compile() -> dict:
    import django

    django.setup()
    from ingestion.compilation.recovery import drain_queued
    from spaces.models import KnowledgeSpace

    space = KnowledgeSpace.objects.get(tenant_id=TENANT, slug=SLUG)
    started = time.perf_counter()
    jobs = drain_queued(space.id)
    return {"jobs": jobs, "compile_seconds": round(time.perf_counter() - started, 2), **_status()}


def child_baseline(warm: bool) -> dict:
    import django

    django.setup()
    from django.conf import settings

    from knowledgefs.runtime import get_embedding_model

    model = get_embedding_model()
    if warm:  # one full batch at the longest input the model takes (256 word pieces)
        text = "Tidal forcing of volcanic eruptions, 1,024 samples. " * 60
        model.embed_documents([text] * settings.KNOWLEDGE_EMBEDDING_BATCH_SIZE)
    return _status()


def child_embed() -> dict:
    """Only the model: embed the compiled chunk texts again, in the compiler's batches of 8."""
    import django

    django.setup()
    from django.conf import settings

    from ingestion.models import KnowledgeNode
    from knowledgefs.runtime import get_embedding_model

    texts = list(
        KnowledgeNode.objects.order_by("document__created_at", "chunk_index").values_list(
            "text", flat=True
        )
    )
    model = get_embedding_model()
    step = settings.KNOWLEDGE_EMBEDDING_BATCH_SIZE
    started = time.perf_counter()
    for start in range(0, len(texts), step):
        model.embed_documents(texts[start : start + step])
    return {
        "texts": len(texts),
        "embed_seconds": round(time.perf_counter() - started, 2),
        **_status(),
    }


def child_report() -> dict:
    import django

    django.setup()
    from django.conf import settings

    from ingestion.models import Document, ParseArtifact
    from ingestion.retained_bytes import estimate_retained_bytes
    from spaces.models import KnowledgeSpace

    space = KnowledgeSpace.objects.get(tenant_id=TENANT, slug=SLUG)
    budget = settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES
    rows = []
    for document in Document.objects.filter(space=space).order_by("-size_bytes"):
        artifact = ParseArtifact.objects.filter(document=document).order_by("-created_at").first()
        row = {
            "file": document.filename,
            "bytes": document.size_bytes,
            "mime_type": document.mime_type,
            "state": document.state,
            "error_code": document.error_code,
            "nodes": document.node_count,
        }
        if artifact is not None:
            row.update(
                elements=len(artifact.elements),
                charge_bytes=estimate_retained_bytes(artifact.elements, budget),
                estimate_uncapped_bytes=estimate_retained_bytes(artifact.elements, 1 << 40),
                budget_bytes=budget,
            )
        rows.append(row)
    return {"documents": rows}


def _status() -> dict:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[key + "_kib"] = int(value.split()[0])
    return fields


# --- the parent -----------------------------------------------------------------------------


def run_child(args: list[str], env: dict) -> dict:
    """Run ``rss.py --child …`` and measure it: ``ru_maxrss``, ``VmHWM`` and an RSS trace."""
    started = time.perf_counter()
    log = Path(env["KNOWLEDGE_VAR_DIR"]) / f"child-{args[1]}.log"
    with open(log, "w") as err_handle:  # a file, not a pipe: a chatty child cannot block
        process = subprocess.Popen(
            [sys.executable, __file__, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err_handle,
            text=True,
        )
    trace, hwm = [], 0
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        try:
            for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                    trace.append((round(time.perf_counter() - started, 1), rss))
                elif line.startswith("VmHWM:"):
                    hwm = max(hwm, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
        time.sleep(0.1)
    process.returncode = os.waitstatus_to_exitcode(status)
    out = process.stdout.read()
    if process.returncode:
        tail = log.read_text()[-4000:]
        raise RuntimeError(f"child {args[:2]} failed ({process.returncode}):\n{tail}")
    payload = json.loads(out.strip().splitlines()[-1])
    step = max(1, len(trace) // 60)
    return {
        **payload,
        "ru_maxrss_kib": usage.ru_maxrss,
        "vmhwm_polled_kib": hwm,
        "wall_seconds": round(time.perf_counter() - started, 2),
        "rss_trace_kib": trace[::step],
    }


def sample_files(n: int) -> list[dict]:
    """The ``n`` largest files under ../shared/data that the service accepts, by sniffed type."""
    import django

    django.setup()
    from ingestion import parsing

    found = []
    for path in SHARED_DATA.rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        try:
            mime = parsing.sniff_mime_type(data, path.name)
        except parsing.ParseError:
            continue
        found.append({"path": str(path), "bytes": len(data), "mime_type": mime})
    return sorted(found, key=lambda f: -f["bytes"])[:n]


def large_files(count: int, size: int, folder: Path) -> list[dict]:
    """``count`` text files of about ``size`` bytes from disjoint runs of SciFact abstracts."""
    folder.mkdir(parents=True, exist_ok=True)
    files, parts, used = [], [], 0
    with gzip.open(SHARED_DATA / "scifact" / "corpus.jsonl.gz", "rt", encoding="utf-8") as src:
        for line in src:
            record = json.loads(line)
            part = f"{record.get('title', '').strip()}\n\n{record.get('text', '').strip()}\n\n"
            parts.append(part)
            used += len(part.encode())
            if used >= size:
                path = folder / f"scifact-run-{len(files) + 1}.txt"
                path.write_text("".join(parts), encoding="utf-8")
                files.append(
                    {
                        "path": str(path),
                        "bytes": path.stat().st_size,
                        "mime_type": "text/plain",
                        "abstracts": len(parts),
                    }
                )
                parts, used = [], 0
                if len(files) == count:
                    break
    return files


def measure(name: str, files: list[dict], budget: dict, base: Path) -> dict:
    var = base / f"{name}-{budget['name']}"
    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    env = {
        **os.environ,
        "KNOWLEDGE_VAR_DIR": str(var),
        "KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY": str(budget["concurrency"]),
        "KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES": str(budget["bytes"]),
        "LOG_LEVEL": "ERROR",
    }
    run_child(["--child", "setup", *[f["path"] for f in files]], env)
    compiled = run_child(["--child", "compile"], env)
    report = run_child(["--child", "report"], env)
    embed = run_child(["--child", "embed"], env) if budget["name"] == "default" else None
    print(
        f"{name}/{budget['name']}: peak {compiled['ru_maxrss_kib'] / 1024:.1f} MiB "
        f"in {compiled['compile_seconds']} s",
        flush=True,
    )
    return {"compile": compiled, "documents": report["documents"], "embedding_only": embed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--child", choices=["setup", "compile", "baseline", "warm", "report", "embed"]
    )
    parser.add_argument("files", nargs="*")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--large", type=int, default=4)
    parser.add_argument("--large-bytes", type=int, default=MIB)
    parser.add_argument("--repeat", type=int, default=2, help="baseline runs each")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    if args.child:
        payload = {
            "setup": lambda: child_setup(args.files),
            "compile": child_compile,
            "baseline": lambda: child_baseline(False),
            "warm": lambda: child_baseline(True),
            "report": child_report,
            "embed": child_embed,
        }[args.child]()
        print(json.dumps(payload))
        return 0

    if "KNOWLEDGE_VAR_DIR" not in os.environ:
        print("set KNOWLEDGE_VAR_DIR to a state directory of your own", file=sys.stderr)
        return 2
    base = Path(os.environ["KNOWLEDGE_VAR_DIR"]) / "rss"
    base.mkdir(parents=True, exist_ok=True)
    sets = {"sample": sample_files(args.n)}
    if args.large:
        sets["large"] = large_files(args.large, args.large_bytes, base / "inputs")

    baseline_env = {**os.environ, "KNOWLEDGE_VAR_DIR": str(base / "baseline")}
    (base / "baseline").mkdir(exist_ok=True)
    baselines = {
        kind: [run_child(["--child", kind], baseline_env) for _ in range(args.repeat)]
        for kind in ("baseline", "warm")
    }
    base_kib = min(b["ru_maxrss_kib"] for b in baselines["baseline"])
    warm_kib = min(b["ru_maxrss_kib"] for b in baselines["warm"])

    runs = {}
    for set_name, files in sets.items():
        embedding_only = None
        for budget_name, budget in BUDGETS.items():
            run = measure(set_name, files, {**budget, "name": budget_name}, base)
            embedding_only = run.pop("embedding_only") or embedding_only
            run["embedding_only_same_texts"] = embedding_only
            only_kib = embedding_only["ru_maxrss_kib"]
            peak = run["compile"]["ru_maxrss_kib"]
            charges = [d.get("charge_bytes", 0) for d in run["documents"]]
            run["summary"] = {
                "budget": budget,
                "peak_rss_mib": round(peak / 1024, 1),
                "peak_minus_baseline_mib": round((peak - base_kib) / 1024, 1),
                "peak_minus_warm_baseline_mib": round((peak - warm_kib) / 1024, 1),
                "embedding_only_same_texts_peak_mib": round(only_kib / 1024, 1),
                "peak_minus_embedding_only_mib": round((peak - only_kib) / 1024, 1),
                "largest_charge_mib": round(max(charges, default=0) / MIB, 3),
                "sum_of_charges_mib": round(sum(charges) / MIB, 3),
                "budget_bytes_mib": round(budget["bytes"] / MIB, 1),
                "compile_seconds": run["compile"]["compile_seconds"],
                "published": sum(d["state"] == "published" for d in run["documents"]),
                "nodes": sum(d["nodes"] for d in run["documents"]),
            }
            runs[f"{set_name}/{budget_name}"] = run

    result = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "git_head": subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        or os.environ.get("KFS_SOURCE_COMMIT", ""),  # a `git archive` snapshot
        "embedding_threads": os.environ.get("KNOWLEDGE_EMBEDDING_THREADS", "0 (every core)"),
        "sets": sets,
        "baseline_django_and_model_kib": [b["ru_maxrss_kib"] for b in baselines["baseline"]],
        "baseline_with_one_embedding_batch_kib": [b["ru_maxrss_kib"] for b in baselines["warm"]],
        "baseline_mib": round(base_kib / 1024, 1),
        "warm_baseline_mib": round(warm_kib / 1024, 1),
        "runs": runs,
    }
    out = Path(args.out or ROOT / "bench" / "results" / f"rss-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v["summary"] for k, v in runs.items()}, indent=2))
    print(f"baseline {result['baseline_mib']} MiB, warm {result['warm_baseline_mib']} MiB")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
