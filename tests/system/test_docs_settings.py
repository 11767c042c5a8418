"""docs/production-deployment.md stays true to the knowledgefs/settings/ package.

The operator settings table is generated from the settings modules' source by
``scripts/settings_table.py``; these tests run that script as a subprocess against the real
files (and against altered copies, to prove it notices a new setting, a changed default or
range, a removed row), check that docs/configuration.md gives the same defaults and ranges, and
that the production deployment guide's numbers are the code's defaults.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from knowledgefs.testing.fixtures import shared_path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "settings_table.py"
SETTINGS = ROOT / "knowledgefs" / "settings"
DOC = ROOT / "docs" / "production-deployment.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"


def _module():
    spec = importlib.util.spec_from_file_location("settings_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


table = _module()


def run(*args: str | Path) -> subprocess.CompletedProcess:
    """The script in a fresh interpreter, as an operator or CI runs it."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def doc_rows() -> dict[str, list[str]]:
    return table.rows_of(table.table_block(DOC.read_text(encoding="utf-8")))


# --- the real files ------------------------------------------------------------------------------


def test_the_settings_table_matches_settings_py():
    result = run("--check")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_every_environment_variable_settings_py_reads_has_its_row_and_default():
    settings = table.read_settings()
    rows = doc_rows()
    assert len(settings) >= 90  # the module reads about a hundred variables today
    for setting in settings:
        assert setting.name in rows, f"{setting.name} is missing from {DOC.name}"
        assert rows[setting.name][1] == setting.default, setting.name
        if setting.range is not None:
            assert rows[setting.name][2] == setting.range, setting.name
        assert rows[setting.name][3], f"{setting.name} has no meaning in {DOC.name}"
    # Real rows, as an operator reads them.
    assert rows["KNOWLEDGE_UPLOAD_MAX_BYTES"][1:3] == ["15728640 (15 MiB)", "1 – 52428800 (50 MiB)"]
    assert rows["KNOWLEDGE_PDF_RASTERIZER_THUMBNAIL_DPI"][1:3] == [
        "48",
        "12 – `KNOWLEDGE_PDF_RASTERIZER_DPI`",
    ]
    assert rows["KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS"][1] == (
        "`KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS` + 60 (360)"
    )
    assert rows["KNOWLEDGE_RATE_LIMITS"][1] == (
        '`{"default": "1200/minute", "documents.create": "600/minute", '
        '"queries.create": "600/minute", "queries.answer": "600/minute"}`'
    )
    assert rows["UNSTRUCTURED_PDF_MAX_CONCURRENCY"][1] == "unset"
    assert rows["DATABASE_URL"][1] == "unset"


def test_the_reads_found_in_the_source_are_the_ones_django_sees():
    """The parser finds what the module really reads: these defaults are what the imported
    settings module holds (the suite sets none of them)."""
    from django.conf import settings as django_settings

    by_name = {s.name: s for s in table.read_settings()}
    for name in (
        "KNOWLEDGE_JOB_LEASE_SECONDS",
        "KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES",
        "KNOWLEDGE_RESEARCH_MAX_RERANK_CANDIDATES",
        "UNSTRUCTURED_MAX_RESPONSE_BYTES",
        "DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS",
    ):
        shown = by_name[name].default.split(" ")[0]
        assert shown == str(getattr(django_settings, name)), name


def test_configuration_md_gives_the_same_defaults_and_ranges():
    config = table.rows_of(CONFIGURATION.read_text(encoding="utf-8"))
    for setting in table.read_settings():
        assert setting.name in config, f"{setting.name} is missing from {CONFIGURATION.name}"
        if setting.alias_of:
            continue
        cells = [cell.replace("`", "") for cell in config[setting.name]]
        code_default = re.match(r"\d+", setting.default)
        if code_default:
            documented = re.match(r"[\d,]+", cells[1])
            assert documented and documented.group().replace(",", "") == code_default.group(), (
                f"{setting.name}: default {cells[1]!r} in {CONFIGURATION.name}, "
                f"{setting.default!r} in code"
            )
        if setting.bounds:
            numbers = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", cells[2])]
            low, high = setting.bounds
            if isinstance(low, int) and cells[2][:1].isdigit():
                assert numbers[0] == low, f"{setting.name}: range {cells[2]!r}, low {low}"
            if isinstance(high, int):
                assert high in numbers, f"{setting.name}: range {cells[2]!r}, high {high}"


def test_variables_read_outside_settings_py_are_named_in_the_guide():
    text = DOC.read_text(encoding="utf-8")
    names = set()
    for package in ("knowledgefs", "spaces", "ingestion", "retrieval", "upgrades"):
        for path in (ROOT / package).rglob("*.py"):
            if SETTINGS in path.parents or {"tests", "testing"} & set(path.relative_to(ROOT).parts):
                continue  # the settings themselves, and test code (KFS_TEST_*, KFS_REQUIRE_*)
            source = path.read_text(encoding="utf-8")
            names |= set(re.findall(r"os\.environ\.get\(\s*\"([A-Z][A-Z0-9_]+)\"", source))
    names |= set(
        re.findall(r"\$\{([A-Z][A-Z0-9_]+):-", (ROOT / "scripts" / "serve.sh").read_text())
    )
    assert "KNOWLEDGE_LOCAL_TOKENIZER_PATH" in names and "KNOWLEDGE_API_WORKERS" in names
    for name in sorted(names):
        assert f"`{name}`" in text, f"{name} is read but not named in {DOC.name}"


# --- drift is noticed --------------------------------------------------------------------------


def test_a_changed_default_in_the_doc_fails_the_check(tmp_path):
    doc = tmp_path / "production-deployment.md"
    text = DOC.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `KNOWLEDGE_JOB_LEASE"))
    doc.write_text(text.replace(row, row.replace("| 120 (2 min) |", "| 90 |")), encoding="utf-8")
    result = run("--check", "--doc", doc)
    assert result.returncode == 1
    assert (
        "KNOWLEDGE_JOB_LEASE_SECONDS: default '90' in the table, '120 (2 min)' in code"
        in result.stderr
    )
    assert "run python scripts/settings_table.py --write" in result.stderr


def test_a_removed_row_and_a_row_for_nothing_fail_the_check(tmp_path):
    doc = tmp_path / "production-deployment.md"
    text = DOC.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `KNOWLEDGE_OCR_DPI`"))
    stale = "| `KNOWLEDGE_OCR_THREADS` | 1 | 1 – 8 | not a setting |"
    doc.write_text(text.replace(row, stale), encoding="utf-8")
    result = run("--check", "--doc", doc)
    assert result.returncode == 1
    assert "KNOWLEDGE_OCR_DPI: read by settings.py, missing from the table" in result.stderr
    assert "KNOWLEDGE_OCR_THREADS: in the table but not read by settings.py" in result.stderr


def _settings_copy(tmp_path: Path) -> Path:
    """A copy of the settings package under ``tmp_path``."""
    return Path(
        shutil.copytree(
            SETTINGS, tmp_path / "settings", ignore=shutil.ignore_patterns("__pycache__")
        )
    )


def _settings_with(tmp_path: Path, *lines: str) -> Path:
    """The settings package with ``lines`` added at the end of its last module."""
    path = _settings_copy(tmp_path)
    last = table.settings_modules(path)[-1]
    last.write_text(last.read_text(encoding="utf-8") + "\n".join(lines) + "\n", "utf-8")
    return path


def _settings_replacing(tmp_path: Path, old: str, new: str) -> Path:
    """The settings package with ``old`` (found in exactly one module) replaced by ``new``."""
    path = _settings_copy(tmp_path)
    holding = [m for m in table.settings_modules(path) if old in m.read_text(encoding="utf-8")]
    assert len(holding) == 1, holding
    holding[0].write_text(holding[0].read_text(encoding="utf-8").replace(old, new), "utf-8")
    return path


def test_a_new_setting_in_code_fails_the_check_until_it_is_documented(tmp_path):
    settings = _settings_with(
        tmp_path,
        'KNOWLEDGE_PGVECTOR_EF_SEARCH = bounded_int("KNOWLEDGE_PGVECTOR_EF_SEARCH", 40, 1, 1000)',
    )
    result = run("--check", "--settings", settings)
    assert result.returncode == 1
    assert (
        "KNOWLEDGE_PGVECTOR_EF_SEARCH: read by settings.py, missing from the table" in result.stderr
    )

    # --write refuses a setting documented nowhere, and changes nothing.
    doc = tmp_path / "production-deployment.md"
    doc.write_text(DOC.read_text(encoding="utf-8"), encoding="utf-8")
    result = run("--write", "--settings", settings, "--doc", doc)
    assert result.returncode == 1
    assert "KNOWLEDGE_PGVECTOR_EF_SEARCH is read by settings.py but documented neither" in (
        result.stderr
    )
    assert doc.read_text(encoding="utf-8") == DOC.read_text(encoding="utf-8")

    # Once docs/configuration.md has its row, --write takes the prose from there.
    configuration = tmp_path / "configuration.md"
    configuration.write_text(
        CONFIGURATION.read_text(encoding="utf-8")
        + "\n| `KNOWLEDGE_PGVECTOR_EF_SEARCH` | 40 | 1–1000 | HNSW candidates per dense query. "
        "Higher finds more, slower |\n",
        encoding="utf-8",
    )
    result = run("--write", "--settings", settings, "--doc", doc, "--configuration", configuration)
    assert result.returncode == 0, result.stderr
    assert (
        "| `KNOWLEDGE_PGVECTOR_EF_SEARCH` | 40 | 1 – 1000 | HNSW candidates per dense query |"
        in doc.read_text(encoding="utf-8")
    )
    assert run("--check", "--settings", settings, "--doc", doc).returncode == 0


def test_a_changed_range_in_code_fails_the_check(tmp_path):
    old = '"KNOWLEDGE_JOB_MAX_ATTEMPTS", 3, 1, 10'
    settings = _settings_replacing(tmp_path, old, '"KNOWLEDGE_JOB_MAX_ATTEMPTS", 3, 1, 20')
    result = run("--check", "--settings", settings)
    assert result.returncode == 1
    assert "KNOWLEDGE_JOB_MAX_ATTEMPTS: range '1 – 10' in the table, '1 – 20' in code" in (
        result.stderr
    )


def test_a_derived_default_that_changed_must_be_described_again(tmp_path):
    old = "KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS + 60, 60, 7200"
    settings = _settings_replacing(tmp_path, old, old.replace("+ 60,", "+ 120,"))
    result = run("--check", "--settings", settings)
    assert result.returncode == 1
    assert (
        "KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS: its default is now "
        "'KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS + 120' in settings.py" in result.stderr
    )


# --- the seed deployment guide's numbers are requirements ---------------------------------------

#: variable → (default, low, high, words of the seed production deployment guide that fix it).
SEED_NUMBERS = {
    "KNOWLEDGE_UPLOAD_MAX_BYTES": (
        15 * 1024**2,
        1,
        50 * 1024**2,
        "The 15 MiB per-file product limit",
    ),
    "KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY": (
        2,
        1,
        8,
        "Defaults to `2`, accepts `1..8`",
    ),
    "KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY": (
        4,
        1,
        32,
        "Defaults to `4` and accepts `1..32`",
    ),
    "KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES": (
        128 * 1024**2,
        1024**2,
        1024**3,
        "Defaults to `134217728` (128 MiB), accepts 1 MiB through 1 GiB",
    ),
    "KNOWLEDGE_PDF_RASTERIZER_DPI": (144, None, None, "the bounded deployment default is `144`"),
    "KNOWLEDGE_PDF_RASTERIZER_THUMBNAIL_DPI": (
        48,
        None,
        None,
        "the bounded deployment default is `48`",
    ),
    "KNOWLEDGE_PDF_RASTERIZER_TIMEOUT_MS": (30000, None, None, "the deployment default is `30000`"),
    "KNOWLEDGE_PDF_RASTERIZER_MAX_ASSETS": (500, None, None, "the deployment default is `500`"),
    "KNOWLEDGE_PDF_RASTERIZER_MAX_CONCURRENCY": (2, 1, 8, "defaults to `2` and accepts `1..8`"),
    "KNOWLEDGE_RESEARCH_REASONING_MAX_OUTPUT_TOKENS": (8192, None, None, "defaults to `8192`"),
    "KNOWLEDGE_RESEARCH_REASONING_TIMEOUT_MS": (60000, None, None, "defaults to `60000`"),
    "KNOWLEDGE_RESEARCH_MAX_RERANK_CANDIDATES": (
        200,
        None,
        200,
        "Defaults to and is capped at `200`",
    ),
    "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_CONCURRENCY": (
        2,
        1,
        8,
        "Defaults to `2` and accepts `1..8`",
    ),
    "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES": (
        192 * 1024**2,
        None,
        None,
        "Defaults to `201326592` (192 MiB)",
    ),
    "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS": (
        30000,
        None,
        None,
        "Defaults to `30000`",
    ),
    "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS": (
        600000,
        None,
        None,
        "Defaults to `600000`",
    ),
    "KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_CONCURRENCY": (
        2,
        1,
        8,
        "Defaults to `2` and accepts `1..8`",
    ),
    "KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES": (
        30 * 1024**2,
        None,
        100 * 1024**2,
        "Defaults to `31457280` (30 MiB)",
    ),
    "UNSTRUCTURED_MAX_CONCURRENCY": (
        2,
        None,
        None,
        "shared by every remote parser request; defaults to `2`",
    ),
    "UNSTRUCTURED_HEAVY_MAX_CONCURRENCY": (1, None, None, "The bundled parser profile uses `1`"),
    "UNSTRUCTURED_MAX_INPUT_BYTES": (
        15 * 1024**2,
        None,
        50 * 1024**2,
        "Defaults to `15728640` (15 MiB)",
    ),
    "UNSTRUCTURED_REQUEST_TIMEOUT_MS": (600000, None, 3600000, "accepts up to `3600000`"),
    "UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS": (2400000, None, 3600000, "profile uses `2400000`"),
    "UNSTRUCTURED_MAX_RESPONSE_BYTES": (
        32 * 1024**2,
        None,
        None,
        "defaults to `33554432` (32 MiB)",
    ),
    "UNSTRUCTURED_MAX_RETRIES": (0, None, None, "The integrated deployment uses `0`"),
    "DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS": (60000, None, None, "It defaults to `60000`"),
}


def test_the_seed_guide_numbers_are_the_code_defaults():
    by_name = {s.name: s for s in table.read_settings()}
    for name, (default, low, high, _words) in SEED_NUMBERS.items():
        setting = by_name[name]
        assert setting.default.split(" ")[0] == str(default), name
        if low is not None:
            assert setting.bounds[0] == low, name
        if high is not None:
            assert setting.bounds[1] == high, name


def test_the_seed_guide_says_those_numbers():
    seed = next(shared_path("seeds").glob("003_*.txt"), None)
    if seed is None:
        pytest.skip("../shared/seeds/003_*.txt (the production deployment guide) is not present")
    text = " ".join(seed.read_text(encoding="utf-8").split())
    for name, (*_numbers, words) in SEED_NUMBERS.items():
        assert words in text, f"{name}: the seed guide no longer says {words!r}"
