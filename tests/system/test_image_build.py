"""The image's build, without a Docker engine: the Dockerfile's stages, the make targets that build
it offline, and the loopback PostgreSQL its smoke test runs against.

The image itself is built and exercised by ``make image image-smoke`` (scripts/image_smoke.sh:
migrate, API and worker containers, a PDF published and cited, SIGTERM); these tests hold the
structure that keeps that build independent of its base and free of build tools.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def _stages() -> dict[str, tuple[str, list[str]]]:
    """``{name: (parent, instructions)}`` per ``FROM parent AS name``, continuation lines joined."""
    stages: dict[str, tuple[str, list[str]]] = {}
    current = None
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)$", line, re.I)
        if match:
            current = match.group(2)
            stages[current] = (match.group(1), [])
        elif current:
            stages[current][1].append(line)
    return stages


def test_every_stage_starts_from_the_base_argument_or_an_earlier_stage():
    text = DOCKERFILE.read_text()
    assert re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, re.M) == ["python:3.11-slim"]
    seen: set[str] = set()
    for name, (parent, _) in _stages().items():
        assert parent == "${BASE_IMAGE}" or parent in seen, (name, parent)
        seen.add(name)
    # Nothing else names a base or where its Python lives: the interpreter is `python3` on PATH
    # (python:3.11-slim's in /usr/local, Debian's in /usr/bin), its version checked at build time.
    instructions = " ".join(i for _, body in _stages().values() for i in body)
    assert "python:3" not in instructions and "/usr/local" not in instructions
    assert "/usr/bin/python" not in instructions
    (base_install,) = [i for i in _stages()["base"][1] if "apt-get install" in i]
    assert "python3" in base_install.split()
    assert "sys.version_info[:2] == (3, 11)" in base_install


def test_the_final_stages_hold_the_venv_and_no_build_tools():
    stages = _stages()
    build_only = {"python3-venv", "python3-pip", "build-essential", "gcc", "g++", "git"}
    for name in ("base", "api", "unstructured"):
        for instruction in stages[name][1]:
            if "apt-get install" in instruction:
                assert not build_only & set(instruction.split()), (name, instruction)
                assert not [w for w in instruction.split() if w.endswith("-dev")], name
            assert "pip install" not in instruction, (name, instruction)
    for name, venv_stage in (("api", "api-venv"), ("unstructured", "unstructured-venv")):
        parent, body = stages[name]
        assert parent == "base"
        copies = [i for i in body if i.startswith("COPY --from=")]
        assert copies == [f"COPY --from={venv_stage} /opt/venv /opt/venv"], name
        assert stages[venv_stage][0] == "venv"
    assert "ENV LANG=C.UTF-8" in " ".join(stages["base"][1])
    assert any("PATH=/opt/venv/bin:$PATH" in i for i in stages["base"][1])


def test_pip_reads_a_proxy_ca_bundle_from_a_build_secret_never_a_layer():
    text = DOCKERFILE.read_text()
    pip_runs = [i for _, body in _stages().values() for i in body if "pip install" in i]
    assert len(pip_runs) == 2
    for run in pip_runs:
        assert run.startswith("RUN --mount=type=secret,id=pip_cert ")
        assert "export PIP_CERT=/run/secrets/pip_cert" in run
    assert not re.search(r"^(ARG|ENV)\b.*PIP_CERT", text, re.M)


def test_make_image_builds_on_the_debootstrap_base_with_the_host_network_only():
    env = dict(os.environ, PIP_CERT="/etc/ssl/certs/ca-certificates.crt")
    dry_run = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "image", "image-smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = dry_run.splitlines()
    assert any(line.endswith("bash scripts/docker_daemon.sh") for line in lines)
    assert any("KFS_BASE_IMAGE=kfs-base:bookworm bash scripts/base_image.sh" in x for x in lines)
    build = " ".join(line for line in lines if " build " in line or line.startswith("\t"))
    assert "DOCKER_BUILDKIT=1" in build and "--network host --target api" in build
    assert "--build-arg BASE_IMAGE=kfs-base:bookworm" in dry_run
    if Path(env["PIP_CERT"]).is_file():
        assert "--secret id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt" in dry_run
    assert "-t knowledge-fs:latest ." in dry_run
    assert "bash scripts/image_smoke.sh knowledge-fs:latest" in dry_run
    assert (ROOT / "tests" / "fixtures" / "image-smoke" / "statement.pdf").read_bytes()[:5] == (
        b"%PDF-"
    )


@pytest.mark.timeout(180)
def test_with_postgres_tcp_serves_the_server_on_a_loopback_port():
    probe = (
        "import os, psycopg, urllib.parse\n"
        "url = os.environ['DATABASE_URL']\n"
        "parsed = urllib.parse.urlparse(url)\n"
        "with psycopg.connect(url.replace('postgres://', 'postgresql://', 1)) as c:\n"
        "    c.execute('CREATE EXTENSION vector')\n"
        "    one = c.execute(\"SELECT '[1,2]'::vector <-> '[1,2]'::vector\").fetchone()[0]\n"
        "print(parsed.hostname, parsed.port > 0, one)\n"
    )
    result = subprocess.run(
        [sys.executable, "scripts/with_postgres.py", "--tcp", sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-1] == "127.0.0.1 True 0.0"
