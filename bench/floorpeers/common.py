"""The parent side of bench/floor.py and bench/peers.py: a venv of their own built from a pinned
requirements file (never the project's dependencies), one child process per size inside it, and
the results file. Standard library only."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent


def ensure_venv(venv: Path, requirements: Path) -> Path:
    """Create ``venv`` (``python -m venv`` of this interpreter) and ``pip install -r
    requirements`` unless its stamp holds the requirements' sha256; returns its python."""
    python = venv / "bin" / "python"
    stamp = venv / ".requirements.sha256"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "-r", str(requirements)], check=True
    )
    stamp.write_text(digest + "\n")
    return python


def installed_versions(python: Path) -> dict[str, str]:
    """``pip freeze`` of the venv as ``{name: version}`` (what the results were measured with)."""
    out = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True
    ).stdout
    pairs = (line.split("==", 1) for line in out.splitlines() if "==" in line)
    return {name.lower(): version for name, version in pairs}


def run_child(
    python: Path,
    script: str,
    args: list[str],
    timeout_s: int,
    blas_threads: int,
    extra_env: dict | None = None,
) -> dict:
    """Run ``bench/floorpeers/<script>`` in the venv with ``bench/`` on ``PYTHONPATH`` and
    ``blas_threads`` OpenBLAS/OpenMP threads (one query at a time: on this loaded 2-core machine
    a 2-thread OpenBLAS matrix-vector product over 10k × 384 took 11 ms against 0.5 ms on one
    thread); the child prints one JSON object as its last stdout line."""
    env = dict(os.environ, PYTHONPATH=str(BENCH), PYTHONHASHSEED="0")
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(blas_threads)
    env.update(extra_env or {})
    env.pop("DJANGO_SETTINGS_MODULE", None)
    command = [str(python), str(BENCH / "floorpeers" / script), *args]
    done = subprocess.run(
        command, env=env, stdout=subprocess.PIPE, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}", "command": " ".join(command)}
    return json.loads(done.stdout.strip().splitlines()[-1])


def git_head() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip()


def finish(kind: str, what: str, versions: dict, key: str, results: list[dict], args) -> int:
    """Write the run's record (``what``, when, commit, state, machine, package ``versions``,
    BLAS threads, top 10 of 50 per leg, ``results`` under ``key``) with :func:`write_results`;
    exit status 1 when a point failed."""
    import platform

    data = {
        "what": what,
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": git_head(),
        "state": os.environ.get("KFS_SCALE_VAR", "/work/scale-var"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
        "blas_threads": args.blas_threads,
        "top_k": 10,
        "depth": 50,
        key: results,
    }
    path = write_results(kind, data, args.out)
    log(f"wrote {path}")
    return 1 if any("error" in r for r in results) else 0


def write_results(kind: str, data: dict, out: str | None) -> Path:
    """``bench/results/<kind>-<UTC date>.json`` (or ``out``)."""
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    path = Path(out) if out else BENCH / "results" / f"{kind}-{date}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def log(message: str) -> None:
    stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
    print(f"[{stamp} load {os.getloadavg()[0]:.2f}] {message}", file=sys.stderr, flush=True)
