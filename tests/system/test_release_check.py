"""``scripts/release_check.py`` (``make release-check``): the steps in order, the OpenAPI
export compared byte for byte with the committed document, a stop at the first failing step
with the steps after it named, and every step printed as ``step → seconds → result``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import release_check

ROOT = Path(__file__).resolve().parents[2]

STEPS = [
    "lint",
    "test-sqlite",
    "test-postgres",
    "test-mariadb",
    "eval-gate",
    "openapi",
    "migrations",
    "compose",
    "image",
    "git-diff-check",
]


def test_the_steps_in_the_order_of_the_release():
    result = subprocess.run(
        [sys.executable, "scripts/release_check.py", "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == STEPS


def test_an_unknown_step_is_refused_by_name():
    result = subprocess.run(
        [sys.executable, "scripts/release_check.py", "lnt"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "unknown step(s) lnt" in result.stderr


def test_a_stale_openapi_document_fails_and_the_committed_one_passes(tmp_path, monkeypatch):
    stale = tmp_path / "openapi.json"
    document = json.loads((ROOT / "docs" / "openapi.json").read_text())
    document["info"]["version"] = "0.0.0-stale"
    stale.write_text(json.dumps(document, indent=4))
    monkeypatch.setattr(release_check, "OPENAPI", stale)
    assert release_check.openapi() == 1
    shutil.copy(ROOT / "docs" / "openapi.json", stale)
    assert release_check.openapi() == 0


def test_the_first_failure_stops_the_run_and_each_step_is_timed(monkeypatch, capsys):
    ran = []

    def step(name: str, status: int):
        def run() -> int:
            ran.append(name)
            return status

        return run

    monkeypatch.setattr(
        release_check,
        "STEPS",
        {"one": step("one", 0), "two": step("two", 2), "three": step("three", 0)},
    )
    assert release_check.main([]) == 1
    assert ran == ["one", "two"]
    out = capsys.readouterr().out
    assert "=== one → 0.0 s → ok" in out
    assert "=== two → 0.0 s → FAILED (exit 2)" in out
    assert "not run after the failure: three" in out


@pytest.mark.parametrize("skip", [["--skip", "two"]])
def test_skipped_steps_are_named(monkeypatch, capsys, skip):
    monkeypatch.setattr(release_check, "STEPS", {"one": lambda: 0, "two": lambda: 1})
    assert release_check.main(skip) == 0
    assert "skipped: two" in capsys.readouterr().out
