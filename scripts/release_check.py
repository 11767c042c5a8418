"""The release check (``make release-check``; docs/testing.md, "Release check").

Runs the steps below in order, stops at the first failure and prints each step as
``step → seconds → result``, then a summary table. Usage::

    python scripts/release_check.py [--skip STEP ...] [--list]
    python scripts/release_check.py openapi | migrations     # one built-in step alone

Steps: ``lint`` (ruff, import contracts, import graph, mypy), ``test-sqlite``, ``test-postgres``,
``test-mariadb``, ``eval-gate`` (the Makefile targets), ``openapi`` (``spectacular --validate
--fail-on-warn`` and the committed ``docs/openapi.json`` equal to a fresh export),
``migrations`` (``makemigrations --check --dry-run``; then, on a throw-away SQLite database
migrated to the leaves, ``migrate --plan APP PREVIOUS`` of every app's last migration: the
downgrade plan renders, refused or not, exit 0 or 3), ``compose`` (the Compose file rendered by
``docker-compose``), ``image`` (``make image image-smoke``: the image build and its bundle smoke
test) and ``git-diff-check``. ``--parallel`` runs the chosen test steps (``test-sqlite``,
``test-postgres``, ``test-mariadb``, ``eval-gate``) as one step ``tests``, side by side and
isolated from each other, as ``make test`` does (``scripts/run_passes.py``).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MAKE = os.environ.get("MAKE", "make")
OPENAPI = ROOT / "docs" / "openapi.json"
REFUSED_EXIT_STATUS = 3  # knowledgefs.downgrades.REFUSED_EXIT_STATUS


def _run(command: list[str], env: dict[str, str] | None = None) -> int:
    print(f"$ {' '.join(command)}", flush=True)
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def _make(*targets: str) -> Callable[[], int]:
    # -o .venv/.installed: the venv is installed already (by `make install` or CI).
    return lambda: _run([MAKE, "--no-print-directory", "-o", ".venv/.installed", *targets])


def _scratch_env(var_dir: Path) -> dict[str, str]:
    """The embedded default (SQLite) in a var dir of its own, whatever DATABASE_URL says."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["KNOWLEDGE_VAR_DIR"] = str(var_dir)
    return env


def openapi() -> int:
    with tempfile.TemporaryDirectory(prefix="release-openapi-", dir=_var()) as scratch:
        fresh = Path(scratch) / "openapi.json"
        status = _run(
            [
                PYTHON,
                "manage.py",
                "spectacular",
                "--validate",
                "--fail-on-warn",
                "--format",
                "openapi-json",
                "--file",
                str(fresh),
            ],
            env=_scratch_env(Path(scratch)),
        )
        if status != 0:
            return status
        if not OPENAPI.exists() or not filecmp.cmp(fresh, OPENAPI, shallow=False):
            print(
                "docs/openapi.json differs from a fresh export; write it with `make openapi` "
                "and commit it",
                file=sys.stderr,
            )
            return 1
        print("docs/openapi.json equals a fresh export")
    return 0


def _last_migrations(env: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(app, last, previous)`` of every project app; ``previous`` is ``zero`` for a first."""
    code = (
        "import django; django.setup()\n"
        "from django.db.migrations.loader import MigrationLoader\n"
        "g = MigrationLoader(None, ignore_no_migrations=True).graph\n"
        "for app, name in sorted(g.leaf_nodes()):\n"
        "    if app not in ('knowledgefs', 'spaces', 'ingestion', 'retrieval', 'upgrades'):\n"
        "        continue\n"
        "    parents = [p for p in g.node_map[(app, name)].parents if p.key[0] == app]\n"
        "    print(app, name, parents[0].key[1] if parents else 'zero')\n"
    )
    env = {**env, "DJANGO_SETTINGS_MODULE": "knowledgefs.settings"}
    out = subprocess.run(
        [PYTHON, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    return [
        (app, last, previous)
        for app, last, previous in (ln.split() for ln in out.split("\n") if ln)
    ]


def migrations() -> int:
    with tempfile.TemporaryDirectory(prefix="release-migrations-", dir=_var()) as scratch:
        env = _scratch_env(Path(scratch))
        status = _run([PYTHON, "manage.py", "makemigrations", "--check", "--dry-run"], env=env)
        if status != 0:
            return status
        status = _run([PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], env=env)
        if status != 0:
            return status
        lasts = _last_migrations(env)
        if not lasts:
            print("no project migration found", file=sys.stderr)
            return 1
        for app, last, previous in lasts:
            status = _run([PYTHON, "manage.py", "migrate", "--plan", app, previous], env=env)
            if status not in (0, REFUSED_EXIT_STATUS):
                print(f"the downgrade plan of {app} {last} did not render", file=sys.stderr)
                return status or 1
            verdict = "refused by its guard" if status else "allowed"
            print(f"downgrade plan of {app} {last} → {previous}: rendered, {verdict}")
    return 0


def _var() -> Path:
    path = ROOT / "var"
    path.mkdir(exist_ok=True)
    return path


def compose() -> int:
    env = {**os.environ, "KFS_REQUIRE_COMPOSE": "1"}
    return _run(
        [PYTHON, "-m", "pytest", "-q", "tests/system/test_compose_render.py"],
        env=env,
    )


def git_diff_check() -> int:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        print("not a git checkout", file=sys.stderr)
        return 1
    return _run(["git", "diff", "--check", "HEAD"])


STEPS: dict[str, Callable[[], int]] = {
    "lint": _make("lint"),
    "test-sqlite": _make("test-sqlite"),
    "test-postgres": _make("test-postgres"),
    "test-mariadb": _make("test-mariadb"),
    "eval-gate": _make("eval-gate"),
    "openapi": openapi,
    "migrations": migrations,
    "compose": compose,
    # The image build and the bundle smoke test: the Makefile's `image` and `image-smoke`
    # targets (Dockerfile, scripts/image_smoke.sh).
    "image": _make("image", "image-smoke"),
    "git-diff-check": git_diff_check,
}


TEST_STEPS = ("test-sqlite", "test-postgres", "test-mariadb", "eval-gate")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("only", nargs="*", help=f"run these steps only: {', '.join(STEPS)}")
    parser.add_argument("--skip", action="append", default=[], choices=list(STEPS))
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="the test steps side by side, isolated, as `make test` runs them (run_passes.py)",
    )
    parser.add_argument("--list", action="store_true", help="print the steps and exit")
    args = parser.parse_args(argv)
    unknown = [s for s in args.only if s not in STEPS]
    if unknown:
        parser.error(f"unknown step(s) {', '.join(unknown)}; the steps: {', '.join(STEPS)}")
    if args.list:
        print("\n".join(STEPS))
        return 0
    chosen = [s for s in STEPS if (not args.only or s in args.only) and s not in args.skip]
    steps: dict[str, Callable[[], int]] = dict(STEPS)
    tests = [s for s in chosen if s in TEST_STEPS] if args.parallel else []
    if tests:  # one step in place of the test steps: the chosen ones side by side
        left_out = [f"--skip={s}" for s in TEST_STEPS if s not in tests]
        steps["tests"] = lambda: _run([PYTHON, "scripts/run_passes.py", *left_out])
        first = chosen.index(tests[0])
        chosen = [s for s in chosen if s not in tests]
        chosen.insert(first, "tests")
    results: list[tuple[str, float, str]] = []
    status = 0
    for name in chosen:
        print(f"=== {name}", flush=True)
        started = time.monotonic()
        status = steps[name]()
        seconds = time.monotonic() - started
        result = "ok" if status == 0 else f"FAILED (exit {status})"
        results.append((name, seconds, result))
        print(f"=== {name} → {seconds:.1f} s → {result}", flush=True)
        if status != 0:
            break
    print("\nrelease check:")
    for name, seconds, result in results:
        print(f"  {name:<16} {seconds:>8.1f} s  {result}")
    skipped = [s for s in STEPS if s not in chosen and s not in tests]
    not_run = chosen[len(results) :]
    if skipped:
        print(f"  skipped: {', '.join(skipped)}")
    if not_run:
        print(f"  not run after the failure: {', '.join(not_run)}")
    print(f"  total {sum(s for _, s, _ in results):.1f} s")
    return 1 if status else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
