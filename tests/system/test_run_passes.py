"""``scripts/run_passes.py`` (``make test``): the lanes run side by side, each with its own var,
runtime and tmp folder, one line per target with pytest's counts, the log's tail of a failed
target and a non-zero exit. ``MAKE`` names a stand-in that prints what it was given (the real
targets are the suite itself)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STAND_IN = """#!/bin/sh
target=$4 start=$(date +%s.%N)
echo "target=$target var=$KNOWLEDGE_VAR_DIR runtime=$XDG_RUNTIME_DIR tmp=$TMPDIR start=$start \
threads=$KNOWLEDGE_EMBEDDING_THREADS"
[ -d "$KNOWLEDGE_VAR_DIR" ] && [ -d "$XDG_RUNTIME_DIR" ] && [ -d "$TMPDIR" ] || exit 9
sleep 1
echo "end=$(date +%s.%N)"
case "$target" in
  test-postgres) echo "1 failed, 20 passed, 3 skipped, 2 warnings in 12.30s (0:00:12)"; exit 1 ;;
  *) echo "5 passed, 1 skipped in 1.00s" ;;
esac
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    make = tmp_path / "make"
    make.write_text(STAND_IN)
    make.chmod(0o755)
    return subprocess.run(
        [sys.executable, "scripts/run_passes.py", "--var", str(tmp_path / "var"), *args],
        cwd=ROOT,
        env={**os.environ, "MAKE": str(make)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_lanes_run_side_by_side_isolated_and_a_failure_fails_the_run(tmp_path):
    result = _run(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [re.sub(r"→ \d+ s →", "→ N s →", line) for line in result.stdout.splitlines()]
    assert "test-sqlite → N s → ok (5 passed, 1 skipped)" in lines
    assert "test-postgres → N s → FAILED (exit 1) (1 failed, 20 passed, 3 skipped)" in lines
    assert "test-mariadb → N s → ok (5 passed, 1 skipped)" in lines
    assert "eval-gate → N s → ok (5 passed, 1 skipped)" in lines
    assert lines[-1].startswith("all passes → ") and lines[-1].endswith("1 failed: test-postgres")
    # the failed target's log tail is printed
    assert "1 failed, 20 passed, 3 skipped, 2 warnings in 12.30s (0:00:12)" in result.stdout
    logs = tmp_path / "var" / "test-logs"
    seen = {}
    for target in ("test-sqlite", "test-postgres", "test-mariadb", "eval-gate"):
        log = (logs / f"{target}.log").read_text().splitlines()
        seen[target] = dict(field.split("=", 1) for field in [*log[1].split(), log[2]])
    # side by side: the two long lanes ran at the same time; a lane's targets one after the other
    sqlite, postgres = seen["test-sqlite"], seen["test-postgres"]
    assert float(sqlite["start"]) < float(postgres["end"])
    assert float(postgres["start"]) < float(sqlite["end"])
    assert float(seen["test-mariadb"]["end"]) <= float(seen["eval-gate"]["start"])
    folders = {
        key: {seen[t][key] for t in ("test-sqlite", "test-postgres", "test-mariadb")}
        for key in ("var", "runtime", "tmp")
    }
    assert all(len(values) == 3 for values in folders.values()), folders  # one per lane
    assert seen["test-sqlite"]["var"] == str(tmp_path / "var" / "passes" / "sqlite")
    assert seen["eval-gate"]["var"] == seen["test-mariadb"]["var"]  # one lane, one after the other
    # the local models' threads: half the cores each, unless set
    threads = os.environ.get("KNOWLEDGE_EMBEDDING_THREADS") or str(max(1, os.cpu_count() // 2))
    assert {t["threads"] for t in seen.values()} == {threads}
    # the runtime and tmp folders are gone with their lane
    assert not any(Path(p).exists() for t in seen.values() for p in (t["runtime"], t["tmp"]))


def test_skip_and_only_choose_the_targets(tmp_path):
    result = _run(tmp_path, "--only", "mariadb", "--skip", "eval-gate")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^test-mariadb → \d+ s → ok \(5 passed, 1 skipped\)$", result.stdout, re.M)
    assert "eval-gate" not in result.stdout.replace("--skip", "")
    assert "test-sqlite" not in result.stdout
