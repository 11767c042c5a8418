"""The Compose deployment (compose/), the Dockerfile and the env examples, without a Docker engine.

The Compose file is validated against the Compose specification schema that check-jsonschema
vendors; then the structure the production deployment guide requires is asserted: port 8787 on
the internal network only, health checks, readiness gate, profile names, the parser's CPU and
memory caps, an unprivileged image user, commands that exist, and env examples that hold only
settings the ``knowledgefs/settings/`` package reads (never Dify-owned credentials). Finally the
settings are really loaded with the example files, as the containers would load them.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import get_commands
from ruamel.yaml import YAML

from knowledgefs.boundary import forbidden_credentials

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / "compose" / "knowledge-fs.env.example"
PARSER_ENV_EXAMPLE = ROOT / "compose" / "knowledge-fs-unstructured.env.example"

API = "knowledge_fs"
WORKER = "knowledge_fs_worker"
MIGRATE = "knowledge_fs_migrate"
READY = "knowledge_fs_ready"
DB = "knowledge_fs_db"
REDIS = "knowledge_fs_redis"
PARSER = "knowledge_fs_unstructured"
APP_SERVICES = (API, WORKER, MIGRATE, READY)

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.fixture(scope="module")
def compose() -> dict:
    return YAML(typ="safe").load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def _env_names(path: Path) -> dict[str, str]:
    """``NAME -> value`` of every ``NAME=value`` line, commented-out ones included."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"#?\s*([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if match:
            found[match.group(1)] = match.group(2)
    return found


def _settings_reads() -> set[str]:
    """Environment variables the ``knowledgefs/settings/`` modules read: the first string
    argument of ``env.<type>(…)``, ``bounded_int(…)``, ``os.environ.get(…)``,
    ``database_from_url(…)`` and both of ``_with_alias(…)``."""
    modules = sorted((ROOT / "knowledgefs" / "settings").glob("*.py"))
    names: set[str] = set()
    for node in (n for path in modules for n in ast.walk(ast.parse(path.read_text()))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        dotted = (
            f"{getattr(func.value, 'id', getattr(func.value, 'attr', ''))}.{func.attr}"
            if isinstance(func, ast.Attribute)
            else getattr(func, "id", "")
        )
        reads = dotted.startswith("env.") or dotted in {
            "bounded_int",
            "environ.get",
            "database_from_url",
            "_with_alias",
        }
        if not reads:
            continue
        count = 2 if dotted == "_with_alias" else 1
        for arg in node.args[:count]:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.add(arg.value)
    return names


def _dockerfile_stages() -> dict[str, list[str]]:
    """Instructions (continuation lines joined) per ``FROM … AS name`` stage."""
    stages: dict[str, list[str]] = {}
    current = None
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.I)
        if match:
            current = match.group(1)
            stages[current] = [line]
        elif current:
            stages[current].append(line)
    return stages


# --- the Compose specification ----------------------------------------------------------------


def test_the_compose_file_is_valid_against_the_compose_specification():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(COMPOSE),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok -- validation done" in result.stdout


def test_the_services_and_their_profiles(services):
    assert set(services) == {API, WORKER, MIGRATE, READY, DB, REDIS, PARSER}
    assert {name: s.get("profiles") for name, s in services.items() if s.get("profiles")} == {
        REDIS: ["redis"],
        PARSER: ["knowledge-fs-unstructured"],
    }


# --- the API: port 8787 internal, liveness and readiness --------------------------------------


def test_the_api_listens_on_8787_on_the_internal_networks_only(compose, services):
    api = services[API]
    assert api["expose"] == ["8787"]
    assert "0.0.0.0:8787" in api["command"]
    assert not [name for name, s in services.items() if "ports" in s]  # nothing on the host
    assert compose["networks"]["knowledge_fs"] == {"internal": True}
    assert compose["networks"]["default"]["external"] is True  # Dify's own network
    for name in (DB, REDIS, PARSER):
        assert services[name]["networks"] == ["knowledge_fs"], name


def test_the_api_runs_gunicorn_with_the_settings_of_serve_sh(services):
    serve = (ROOT / "scripts" / "serve.sh").read_text()
    defaults = dict(
        re.findall(r"--(workers|threads|timeout|keep-alive) \"?\$\{?[A-Z_]*:-(\d+)", serve)
    )
    defaults.update(re.findall(r"--(timeout) (\d+)", serve))
    assert defaults == {"workers": "2", "threads": "8", "timeout": "120", "keep-alive": "75"}
    command = services[API]["command"]
    assert command[:2] == ["gunicorn", "knowledgefs.wsgi"]
    options = dict(zip(command[2::2], command[3::2], strict=True))
    assert options == {
        "--bind": "0.0.0.0:8787",
        "--workers": defaults["workers"],
        "--threads": defaults["threads"],
        "--timeout": defaults["timeout"],
        "--keep-alive": defaults["keep-alive"],
        "--access-logfile": "-",
    }
    (cmd,) = [i for i in _dockerfile_stages()["api"] if i.startswith("CMD")]
    assert ast.literal_eval(cmd.removeprefix("CMD").strip()) == command


def test_liveness_is_the_health_check_and_readiness_gates_traffic(services):
    api = services[API]
    assert api["healthcheck"]["test"] == [
        "CMD",
        "python",
        "scripts/probe.py",
        "http://127.0.0.1:8787/health",
    ]
    ready = services[READY]
    assert ready["command"][-3:] == ["http://knowledge-fs:8787/ready", "--wait", "300"]
    # Peers use the alias: Django refuses a Host header with an underscore.
    assert api["networks"] == {
        "default": {"aliases": ["knowledge-fs"]},
        "knowledge_fs": {"aliases": ["knowledge-fs"]},
    }
    assert ready["restart"] == "no"
    assert ready["depends_on"] == {API: {"condition": "service_healthy"}}
    # The probe answers as the health check expects: 0 on 200, 1 otherwise.
    from scripts.probe import main as probe

    assert probe(["http://127.0.0.1:9/health", "--timeout", "0.5"]) == 1


def test_migrations_run_once_before_the_api_and_the_worker(services):
    assert services[MIGRATE]["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert services[MIGRATE]["restart"] == "no"
    for name in (API, WORKER):
        depends = services[name]["depends_on"]
        assert depends[MIGRATE] == {"condition": "service_completed_successfully"}
        assert depends[DB] == {"condition": "service_healthy"}
        assert depends[REDIS] == {"condition": "service_healthy", "required": False}
    assert services[WORKER]["command"] == ["python", "manage.py", "qcluster"]


def test_the_app_services_share_the_var_volume_and_the_injected_dify_settings(services):
    for name in (API, WORKER, MIGRATE):
        service = services[name]
        assert "knowledge_fs_var:/var/lib/knowledgefs" in service["volumes"]
        env = service["environment"]
        assert env["KNOWLEDGE_VAR_DIR"] == "/var/lib/knowledgefs"
        assert env["DIFY_INNER_API_URL"] == "${DIFY_INNER_API_URL:-http://api:5001}"
        assert env["DIFY_INNER_API_KEY"] == "${INNER_API_KEY_FOR_PLUGIN:-}"
        assert "@knowledge_fs_db:5432/knowledgefs" in env["DATABASE_URL"]
        assert service["env_file"] == [{"path": "./knowledge-fs.env", "required": False}]


# --- the database, Redis and the parser ----------------------------------------------------------


def test_the_database_is_postgresql_18_with_pgvector_and_a_health_check(services):
    db = services[DB]
    assert db["image"] == "pgvector/pgvector:pg18"
    assert db["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert db["volumes"] == ["knowledge_fs_db:/var/lib/postgresql"]
    assert db["environment"]["POSTGRES_DB"] == "knowledgefs"


def test_redis_is_optional_and_health_checked(services):
    assert services[REDIS]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_the_parser_profile_is_capped_at_four_cpus_and_6_gib(services):
    parser = services[PARSER]
    assert parser["deploy"]["resources"]["limits"] == {"cpus": "4", "memory": "6g"}
    assert parser["expose"] == ["8000"]
    assert parser["command"][:3] == ["python", "-m", "ingestion.unstructured.server"]
    assert parser["build"]["target"] == "unstructured"
    assert "/healthcheck" in parser["healthcheck"]["test"][-1]
    # The example URL names this service and its port.
    assert (
        _env_names(ENV_EXAMPLE)["UNSTRUCTURED_API_URL"] == "http://knowledge_fs_unstructured:8000"
    )


def test_every_command_refers_to_something_that_exists(services):
    commands = get_commands()
    stages = _dockerfile_stages()
    copied = " ".join(i for i in stages["api"] if i.startswith("COPY"))
    for name, service in services.items():
        command = service.get("command")
        if not command or service.get("image", "").startswith(("pgvector/", "redis:")):
            continue
        if command[:2] == ["python", "manage.py"]:
            assert command[2] in commands, (name, command)
        elif command[:2] == ["python", "-m"]:
            assert (ROOT / (command[2].replace(".", "/") + ".py")).is_file(), (name, command)
        elif command[0] == "python":
            assert (ROOT / command[1]).is_file() and command[1] in copied, (name, command)
        else:
            assert command[:2] == ["gunicorn", "knowledgefs.wsgi"], (name, command)
            assert (ROOT / "knowledgefs" / "wsgi.py").is_file()
    for stage, instructions in stages.items():
        for instruction in instructions:
            # COPY --from=<stage> copies a build stage's venv (tests/system/test_image_build.py).
            if instruction.startswith("COPY") and "--from=" not in instruction:
                *sources, _ = shlex.split(instruction)[1:]
                for source in sources:
                    assert (ROOT / source).exists(), (stage, source)
    for service in services.values():
        test = (service.get("healthcheck") or {}).get("test", [])
        if "scripts/probe.py" in test:
            assert "scripts/probe.py" in copied


# --- the Dockerfile ----------------------------------------------------------------------------


def test_the_image_is_python_311_slim_with_poppler_and_tesseract_and_no_dev_extras():
    text = DOCKERFILE.read_text()
    # The published base is python:3.11-slim; make image builds on a debootstrap bookworm.
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\} AS base$", text, re.M)
    install = next(i for i in _dockerfile_stages()["base"] if "apt-get install" in i)
    assert {"poppler-utils", "tesseract-ocr", "antiword", "catdoc"} <= set(install.split())
    assert "pdftoppm -v" in install and "tesseract --version" in install
    assert "pip install . " in text and ".[dev]" not in text


def test_the_api_image_stops_its_process_group_through_tini_within_the_grace_period(services):
    api = _dockerfile_stages()["api"]
    assert 'ENTRYPOINT ["tini", "-g", "--"]' in api and "STOPSIGNAL SIGTERM" in api
    install = next(i for i in _dockerfile_stages()["base"] if "apt-get install" in i)
    assert "tini" in install.split() and "tini --version" in install
    from django.conf import settings

    worker = next(s for s in services.values() if s.get("command", [])[-1:] == ["qcluster"])
    grace = int(worker["stop_grace_period"].removesuffix("s"))
    assert grace > settings.KNOWLEDGE_WORKER_SHUTDOWN_GRACE_SECONDS + 10


def test_the_images_run_as_an_unprivileged_user():
    stages = _dockerfile_stages()
    (useradd,) = [i for i in stages["base"] if "useradd" in i]
    uid = int(re.search(r"--uid (\d+)", useradd).group(1))
    user = re.search(r"useradd .* (\S+)$", useradd.split("&&")[1].strip()).group(1)
    assert uid >= 1000 and user == "knowledgefs"
    for stage in ("api", "unstructured"):
        users = [i.split()[1] for i in stages[stage] if i.startswith("USER ")]
        assert users == ["knowledgefs:knowledgefs"], stage
        # Nothing after USER switches back to root.
        after = stages[stage][stages[stage].index("USER knowledgefs:knowledgefs") :]
        assert not [i for i in after if i.startswith("RUN")], stage
    assert 'VOLUME ["/var/lib/knowledgefs"]' in stages["api"]
    # The var dir (the volume's mount point) belongs to that user; gunicorn's control socket
    # goes to a per-container runtime dir, never the var volume replicas share.
    assert any("-m 0750 /var/lib/knowledgefs" in i for i in stages["base"])
    assert any("-m 0700 /run/knowledgefs" in i for i in stages["base"])
    assert "ENV XDG_RUNTIME_DIR=/run/knowledgefs" in stages["base"]


def test_the_build_context_leaves_out_local_state_and_secrets():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "var/", "compose/*.env", ".env", "tests/"} <= ignored


# --- the env examples ----------------------------------------------------------------------------


@pytest.mark.parametrize("example", [ENV_EXAMPLE, PARSER_ENV_EXAMPLE], ids=lambda p: p.name)
def test_the_env_examples_hold_only_settings_the_service_reads(example):
    names = _env_names(example)
    assert names
    assert sorted(set(names) - _settings_reads()) == []
    assert not {"DIFY_INNER_API_URL", "DIFY_INNER_API_KEY"} & set(names)
    assert not [n for n in names if n.startswith(("MINIO_", "PLUGIN_DAEMON_", "S3_", "AWS_"))]
    # The boundary's own rule, with every variable holding a value.
    assert forbidden_credentials(dict.fromkeys(names, "x")) == []


def test_the_settings_load_with_the_example_as_the_containers_load_it(tmp_path):
    """The example plus what Compose injects, in a fresh interpreter: start-up checks pass; with
    the redis lines uncommented the worker broker is Redis."""
    example = {k: v for k, v in _env_names(ENV_EXAMPLE).items()}
    commented = {"REDIS_URL", "KNOWLEDGE_QUEUE_BROKER", "KNOWLEDGE_QUEUE_REDIS_URL"}
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KNOWLEDGE_", "UNSTRUCTURED_", "DIFY_", "REDIS_URL", "DATABASE_URL"))
    }
    injected = {
        "DIFY_INNER_API_URL": "http://api:5001",
        "DIFY_INNER_API_KEY": "an-inner-key-of-32-characters-00",
        "DATABASE_URL": "postgres://knowledgefs:knowledgefs@knowledge_fs_db:5432/knowledgefs",
        "KNOWLEDGE_VAR_DIR": str(tmp_path / "var"),
    }
    show = (
        "from django.conf import settings as s; "
        "from django.http.request import validate_host; "
        "assert validate_host('knowledge-fs', s.ALLOWED_HOSTS), s.ALLOWED_HOSTS; "
        "assert validate_host('127.0.0.1', s.ALLOWED_HOSTS), s.ALLOWED_HOSTS; "
        "print(s.KNOWLEDGE_MODEL_RUNTIME, s.DATABASES['default']['HOST'], s.UNSTRUCTURED_API_URL,"
        " s.KNOWLEDGE_QUEUE_BROKER, s.Q_CLUSTER.get('redis', 'orm'), s.Q_CLUSTER['timeout'])"
    )

    def load(env: dict) -> str:
        result = subprocess.run(
            [sys.executable, "-c", f"import django; django.setup(); {show}"],
            cwd=ROOT,
            env={**base, **env, "DJANGO_SETTINGS_MODULE": "knowledgefs.settings"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.strip()

    as_shipped = {k: v for k, v in example.items() if k not in commented}
    assert load({**as_shipped, **injected}) == (
        "dify knowledge_fs_db http://knowledge_fs_unstructured:8000 orm orm 2700"
    )
    assert load({**example, **injected}) == (
        "dify knowledge_fs_db http://knowledge_fs_unstructured:8000 redis "
        "redis://knowledge_fs_redis:6379/1?socket_connect_timeout=5&socket_timeout=15 2700"
    )
