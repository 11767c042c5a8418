"""Schemathesis CLI against gunicorn on loopback: every operation of ``/openapi.json``, no 5xx.

The longer companion of tests/system/test_schemathesis.py (which runs in process, bounded for CI):

1. Uses a fresh ``KNOWLEDGE_VAR_DIR`` (SQLite; or the database of ``DATABASE_URL``, e.g. under
   ``scripts/with_postgres.py``), migrates, and makes a tenant ``kfs-schemathesis`` with a space,
   an API key, one compiled document and a golden question.
2. Starts ``gunicorn knowledgefs.wsgi`` on loopback (``DIFY_INNER_API_KEY`` set, so the
   ``/internal`` routes are on) and asks one answer (``POST /v1/queries``) for a real trace id.
3. Runs ``schemathesis run`` with the check ``not_a_server_error`` only, both generation modes,
   ``--max-examples`` per operation and a fixed ``--seed``; path parameters are pinned to the
   real ids (``schemathesis.toml`` ``[parameters]``), so cases reach the services. Three
   passes, so the data stays while it is needed: the product routes that do not destroy, then
   the operations that do (``DELETE``, the internal space delete), then the other internal
   routes (a cutover ledger they create for the tenant closes its product routes: 409).

Prints one line per pass and a summary (operations, test cases, 5xx responses), and writes the
JUnit reports under ``--out`` (default ``var/schemathesis``). Exit status: 0 when no operation
answered a 5xx. Usage: ``python bench/schemathesis_run.py [--max-examples 100] [--seed 1]``
(``make schemathesis``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")

TENANT = "kfs-schemathesis"
INNER_KEY = "schemathesis-inner-api-key-0123456789"
# Operations (``METHOD /path``) that destroy the pinned data: run in the second pass.
DESTROYING = r"^(DELETE |POST /internal/knowledge-spaces/\{space_id\}/delete$)"


def prepare() -> dict[str, str]:
    """Migrate and create the tenant's data; returns the API key and the ids to pin."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from ingestion.compilation.recovery import drain_queued
    from ingestion.documents import admit_document
    from knowledgefs.auth.principal import Principal
    from retrieval import golden
    from spaces.api_keys import create_api_key
    from spaces.services import create_space

    call_command("migrate", verbosity=0)
    space = create_space(Principal(tenant_id=TENANT), name="Schemathesis")
    key = create_api_key(TENANT, name="schemathesis")[1]
    text = b"Photosynthesis turns light into chemical energy in the chloroplasts of plants.\n"
    admission = admit_document(space, filename="plants.txt", data=text, on_duplicate="reject")
    drain_queued()
    question = golden.create_question(
        space,
        {
            "question": "What turns light into chemical energy?",
            "expected_evidence": [{"document_id": str(admission.document.id)}],
        },
    )
    connections.close_all()
    return {
        "api_key": key,
        "space_id": str(space.id),
        "document_id": str(admission.document.id),
        "job_id": str(admission.job.id),
        "question_id": str(question.id),
        "namespace_id": TENANT,
    }


def answer_trace(port: int, key: str, space_id: str) -> str:
    """One streamed answer over HTTP; returns its trace id (``X-Query-Run-Id``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"space_id": space_id, "query": "What do chloroplasts do?"})
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    conn.request("POST", "/v1/queries", body=body, headers=headers)
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.getheader("X-Query-Run-Id") or ""


def config_file(ids: dict[str, str], directory: Path) -> Path:
    """``schemathesis.toml`` pinning the path parameters to the real ids."""
    lines = ["[parameters]"]
    for name in ("space_id", "document_id", "job_id", "question_id", "trace_id", "namespace_id"):
        if ids.get(name):
            lines.append(f'"path.{name}" = "{ids[name]}"')
    path = directory / "schemathesis.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_pass(name: str, port: int, ids: dict, args, config: Path, selection: list[str]) -> dict:
    """One ``schemathesis run``; returns ``{operations, cases, server_errors, seconds}``."""
    junit = Path(args.out) / f"{name}.junit.xml"
    command = [
        str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config),
        "run", f"http://127.0.0.1:{port}/openapi.json",
        "--checks", "not_a_server_error", "--mode", "all",
        "--max-examples", str(args.max_examples), "--seed", str(args.seed),
        "--workers", "1", "--request-timeout", "60", "--suppress-health-check", "all",
        "--phases", "examples,coverage,fuzzing", "--no-color",
        "--header", f"Authorization: Bearer {ids['api_key']}",
        "--header", f"X-Inner-Api-Key: {INNER_KEY}",
        "--report", "junit", "--report-junit-path", str(junit),
        *selection,
    ]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - started
    (Path(args.out) / f"{name}.log").write_text(result.stdout + result.stderr)
    suites = ET.parse(junit).getroot() if junit.exists() else ET.Element("testsuites")
    cases = suites.iter("testcase")
    operations = failures = 0
    for case in cases:
        operations += 1
        failures += sum(1 for _ in case.iter("failure")) + sum(1 for _ in case.iter("error"))
    generated = _generated(result.stdout)
    return {
        "operations": operations,
        "cases": generated,
        "failed_operations": failures,
        "exit": result.returncode,
        "seconds": round(seconds, 1),
    }


def _generated(output: str) -> int | None:
    """The number of test cases the CLI reports (``N test cases generated``), if printed."""
    for line in output.splitlines():
        words = line.replace(",", " ").split()
        for n, word in enumerate(words[:-1]):
            if word.isdigit() and words[n + 1].startswith("generated"):
                return int(word)
    for line in output.splitlines():
        if "test cases" in line:
            digits = [w for w in line.replace(",", " ").split() if w.isdigit()]
            if digits:
                return int(digits[0])
    return None


def main() -> int:
    """Run both passes (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "var" / "schemathesis"))
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kfs-schemathesis-"))
    os.environ.setdefault("KNOWLEDGE_VAR_DIR", str(work / "var"))
    os.environ["DIFY_INNER_API_KEY"] = INNER_KEY
    ids = prepare()

    from bench.query_latency import Server

    log = Path(args.out) / "gunicorn.log"
    with Server(workers=1, threads=2, log=log) as server:
        ids["trace_id"] = answer_trace(server.port, ids["api_key"], ids["space_id"])
        config = config_file(ids, work)
        selections = {
            "product": ["--include-path-regex", "^/v1/", "--exclude-name-regex", DESTROYING],
            "destroy": ["--include-name-regex", DESTROYING],
            "internal": ["--include-path-regex", "^/internal/", "--exclude-name-regex", DESTROYING],
        }
        passes = {
            name: run_pass(name, server.port, ids, args, config, selection)
            for name, selection in selections.items()
        }
    server_errors = _server_errors(log)
    for name, result in passes.items():
        print(f"{name}: {json.dumps(result)}")
    summary = {
        "operations": sum(p["operations"] for p in passes.values()),
        "cases": sum(p["cases"] or 0 for p in passes.values()),
        "failed_operations": sum(p["failed_operations"] for p in passes.values()),
        "server_errors_logged": server_errors,
        "max_examples": args.max_examples,
        "seed": args.seed,
    }
    print(f"summary: {json.dumps(summary)}")
    return 0 if summary["failed_operations"] == 0 and not server_errors else 1


def _server_errors(log: Path) -> int:
    """Requests gunicorn's Django logged as a server error (``Internal Server Error:``)."""
    if not log.exists():
        return 0
    return log.read_text(errors="replace").count("Internal Server Error:")


if __name__ == "__main__":
    sys.exit(main())
