"""Visual embedding memory: peak RSS of a worker embedding document images, against the bound.

Two documents' images (``--images`` in all, sizes drawn uniformly from ``--min-mib`` to
``--max-mib``, random bytes behind a PNG signature: the client never decodes them) are embedded
by :func:`ingestion.visual.build_visual_projections` in two threads at once, as two concurrent
compilations do, through the simulated Dify (its own process, vectors from each payload's
digest, so only the worker is measured). Objects live in a throw-away local object store.

Processes:

* **setup** (one child): migrates a fresh SQLite state directory, creates a space whose
  embedding profile is the multimodal ``jina-clip-v2`` of the simulated Dify (validated by its
  text plus 1×1 PNG probes), admits and compiles two small documents, writes the image objects;
* **baseline** (fresh child): Django set up, the space's two jobs and asset lists loaded, one
  tiny image embedded (connections and imports warm): its ``ru_maxrss`` is the baseline;
* **transport** (fresh child): the baseline, then one multimodal request of exactly
  ``MAX_BATCH_BYTES`` raw bytes already in memory: its peak minus the baseline minus those
  bytes is the measured transport headroom (base64, JSON body, HTTP buffers) of one request;
* **worker** (fresh child, once per lifecycle-gate width): the baseline, then both documents'
  builds at once; its peak.

The bound per active lifecycle is ``MAX_BATCH_BYTES + MAX_ASSET_BYTES`` (52 MiB with the
defaults, the seed's figure) plus the transport headroom; the gate admits
``KNOWLEDGE_VISUAL_EMBEDDING_MAX_CONCURRENCY`` lifecycles at once, so with two concurrent
documents the bound is ``baseline + width × (52 MiB + headroom)``.

Usage::

    python bench/visual.py [--images 200] [--min-mib 1] [--max-mib 20] [--gates 1,2]
        [--out bench/results/visual.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MIB = 1024 * 1024
TENANT, SLUG = "kfs-visual-bench", "visual-bench"
CLIP = {"plugin_id": "langgenius/jina", "provider": "jina", "model": "jina-clip-v2"}


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _django(url: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
    import django

    django.setup()
    from django.conf import settings

    from knowledgefs.testing.dify_contract import TEST_INNER_KEY

    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"  # models through Dify; objects stay local
    settings.DIFY_INNER_API_URL = url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY


def child_server(ready_file: str) -> None:
    from knowledgefs.testing.dify_server import DifyTestServer

    server = DifyTestServer(dimension=64).start()
    server.image_vectors = "digest"
    Path(ready_file).write_text(server.url)
    while True:
        time.sleep(3600)


def _setup(url: str, images: int, low: int, high: int, seed: int) -> dict:
    """The setup child's work (see the module docstring)."""
    _django(url)
    import hashlib
    import random

    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from ingestion.compilation.recovery import drain_queued
    from ingestion.documents import admit_document
    from knowledgefs import storage
    from knowledgefs.auth.principal import Principal
    from retrieval.embedding_profile import set_embedding_profile
    from spaces.preflight import run_preflight
    from spaces.services import create_space

    principal = Principal(tenant_id=TENANT)
    space = create_space(principal, name="Visual bench", slug=SLUG)
    set_embedding_profile(principal, space.id, CLIP)
    run_preflight(space)
    jobs = []
    for n in range(2):
        admitted = admit_document(
            space, filename=f"doc-{n}.md", data=f"# Document {n}\n\nImages.".encode(),
            enqueue=False,
        )  # fmt: skip
        jobs.append(admitted.job)
    drain_queued()
    rng = random.Random(seed)
    assets: list[list[dict]] = [[], []]
    total = 0
    for index in range(images):
        size = rng.randint(low * MIB, high * MIB)
        data = b"\x89PNG\r\n\x1a\n" + os.urandom(size - 8)
        job = jobs[index % 2]
        key = f"assets/{space.id}/{job.document_id}/{job.id}/bench-{index}.png"
        storage.put_object(key, data)
        assets[index % 2].append(
            {"key": key, "kind": "image", "page_number": index + 1, "mime_type": "image/png",
             "bytes": size, "sha256": hashlib.sha256(data).hexdigest()}
        )  # fmt: skip
        total += size
        del data
    return {"jobs": [str(j.id) for j in jobs], "assets": assets, "bytes": total}


def _load(url: str, state: dict):
    _django(url)
    from ingestion.models import CompilationJob

    jobs = [CompilationJob.objects.select_related("document").get(id=j) for j in state["jobs"]]
    return jobs, state["assets"]


def _warm(jobs) -> None:
    """Connections and imports warm: one tiny image embedded by the space's model."""
    from ingestion.visual import _embed, image_profile
    from spaces.capabilities import PROBE_PNG

    profile, selection = image_profile(jobs[0].space_id)
    _embed(profile, selection, [PROBE_PNG])


def child_measure(url: str, state_file: str, what: str, gate: int) -> dict:
    state = json.loads(Path(state_file).read_text())
    jobs, assets = _load(url, state)
    from django.conf import settings

    settings.KNOWLEDGE_VISUAL_EMBEDDING_MAX_CONCURRENCY = gate
    _warm(jobs)
    baseline = _peak_mib()
    if what == "baseline":
        return {"baseline_mib": baseline}
    if what == "transport":
        from ingestion.visual import _embed, image_profile

        batch = settings.KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_BYTES
        payload = [b"\x89PNG\r\n\x1a\n" + os.urandom(batch // 2 - 8) for _ in range(2)]
        held = _peak_mib()
        profile, selection = image_profile(jobs[0].space_id)
        started = time.monotonic()
        _embed(profile, selection, payload)
        return {
            "baseline_mib": baseline,
            "with_batch_in_memory_mib": held,
            "peak_mib": _peak_mib(),
            "transport_headroom_mib": round(_peak_mib() - held, 1),
            "seconds": round(time.monotonic() - started, 2),
        }
    import threading

    from ingestion.visual import GATE, build_visual_projections

    reports, errors = [None, None], []

    def run(n: int) -> None:
        try:
            reports[n] = build_visual_projections(jobs[n], assets=assets[n])
        except Exception as exc:  # noqa: BLE001 - reported
            errors.append(repr(exc))

    GATE.peak = 0
    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "baseline_mib": baseline,
        "peak_mib": _peak_mib(),
        "seconds": round(time.monotonic() - started, 1),
        "gate_width": gate,
        "gate_peak": GATE.peak,
        "errors": errors,
        "embedded": sum(r.embedded for r in reports if r),
        "requests": sum(r.requests for r in reports if r),
        "largest_raw_lifecycle_mib": round(
            max((r.peak_raw_bytes for r in reports if r), default=0) / MIB, 1
        ),
        "largest_request_mib": round(
            max((b for r in reports if r for _, b in r.batches), default=0) / MIB, 1
        ),
    }


def _child(args: list[str], env: dict) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"child {args[:2]} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--min-mib", type=int, default=1)
    parser.add_argument("--max-mib", type=int, default=20)
    parser.add_argument("--gates", default="1,2")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "server":
            child_server(rest[0])
        elif kind == "setup":
            url, images, low, high, seed, out = rest
            state = _setup(url, int(images), int(low), int(high), int(seed))
            Path(out).write_text(json.dumps(state))
            print(json.dumps({"bytes": state["bytes"]}))
        else:
            url, state_file, what, gate = rest
            print(json.dumps(child_measure(url, state_file, what, int(gate))))
        return
    with tempfile.TemporaryDirectory(prefix="kfs-visual-bench-") as var:
        env = {**os.environ, "KNOWLEDGE_VAR_DIR": var, "DJANGO_SETTINGS_MODULE":
               "knowledgefs.settings", "KNOWLEDGE_MODEL_RUNTIME": "local"}  # fmt: skip
        ready = Path(var) / "server-url"
        server = subprocess.Popen(
            [sys.executable, __file__, "--child", "server", str(ready)], env=env
        )
        try:
            for _ in range(300):
                if ready.exists() and ready.read_text():
                    break
                time.sleep(0.1)
            url = ready.read_text()
            state_file = str(Path(var) / "state.json")
            setup = _child(
                ["--child", "setup", url, str(args.images), str(args.min_mib),
                 str(args.max_mib), str(args.seed), state_file], env,
            )  # fmt: skip
            baseline = _child(["--child", "measure", url, state_file, "baseline", "2"], env)
            transport = _child(["--child", "measure", url, state_file, "transport", "2"], env)
            runs = [
                _child(["--child", "measure", url, state_file, "worker", gate], env)
                for gate in args.gates.split(",")
            ]
        finally:
            server.terminate()
            server.wait(10)
    raw_bound = 32 + 20  # MAX_BATCH_BYTES + MAX_ASSET_BYTES (MiB), the seed's 52 MiB
    headroom = transport["transport_headroom_mib"]
    for run in runs:
        width = min(run["gate_width"], 2)
        run["over_baseline_mib"] = round(run["peak_mib"] - run["baseline_mib"], 1)
        run["bound_mib"] = round(width * (raw_bound + headroom), 1)
        run["within_bound"] = run["over_baseline_mib"] <= run["bound_mib"]
    result = {
        "images": args.images,
        "image_mib": [args.min_mib, args.max_mib],
        "total_image_mib": round(setup["bytes"] / MIB, 1),
        "seed_bound_per_lifecycle_mib": raw_bound,
        "baseline": baseline,
        "transport": transport,
        "runs": runs,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
