"""``compose/kubernetes/knowledge-fs-baseline.yaml``, the inert Kubernetes reference: every
resource valid against the Kubernetes JSON schemas (``kubernetes-validate`` ships them, strict:
unknown fields refused; validated with the network closed), then what makes it inert and safe:
both Deployments at ``replicas: 0``, the migration Job suspended, a ClusterIP Service on 8787,
no Ingress, liveness ``/health`` and fail-closed readiness ``/ready``, non-root with a read-only
root filesystem and every writable path a volume, secrets referenced (``secretKeyRef``) and
never inlined, requests and limits from the sizing section of the production guide.
"""

from __future__ import annotations

import copy
import socket
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from knowledgefs.boundary import forbidden_credentials

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "compose" / "kubernetes" / "knowledge-fs-baseline.yaml"
# The oldest Kubernetes minor still in common support, and the newest the package ships.
VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
WRITABLE = {"/var/lib/knowledgefs", "/tmp", "/run/knowledgefs"}  # VAR_DIR, TMPDIR, XDG_RUNTIME_DIR
SECRETS = {"SECRET_KEY", "DATABASE_URL", "DIFY_INNER_API_KEY"}


@pytest.fixture(scope="module")
def resources() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(BASELINE.read_text()) if doc]


def _by_kind(resources: list[dict], kind: str) -> dict[str, dict]:
    return {r["metadata"]["name"]: r for r in resources if r["kind"] == kind}


def _pods(resources: list[dict]) -> dict[str, dict]:
    """Pod specs of the Deployments and the Job, by resource name."""
    return {
        r["metadata"]["name"]: r["spec"]["template"]["spec"]
        for r in resources
        if r["kind"] in ("Deployment", "Job")
    }


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network used: {args!r}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_resource_is_valid_against_the_kubernetes_schemas(resources, version, no_network):
    assert [r["kind"] for r in resources] == [
        "ConfigMap",
        "PersistentVolumeClaim",
        "Service",
        "Deployment",
        "Deployment",
        "Job",
    ]
    for resource in resources:
        kubernetes_validate.validate(resource, version, strict=True)


def test_the_schema_check_refuses_what_kubernetes_would(resources, no_network):
    api = copy.deepcopy(_by_kind(resources, "Deployment")["knowledge-fs-api"])
    api["spec"]["replicas"] = "0"
    with pytest.raises(kubernetes_validate.ValidationError, match="'0' is not of type"):
        kubernetes_validate.validate(api, VERSIONS[-1], strict=True)
    api = copy.deepcopy(_by_kind(resources, "Deployment")["knowledge-fs-api"])
    api["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(api, VERSIONS[-1], strict=True)


def test_inert_nothing_runs_and_nothing_is_reachable_from_outside(resources):
    deployments = _by_kind(resources, "Deployment")
    assert {name: d["spec"]["replicas"] for name, d in deployments.items()} == {
        "knowledge-fs-api": 0,
        "knowledge-fs-worker": 0,
    }
    assert _by_kind(resources, "Job")["knowledge-fs-migrate"]["spec"]["suspend"] is True
    assert not [r for r in resources if r["kind"] in ("Ingress", "Gateway", "HTTPRoute")]
    (service,) = _by_kind(resources, "Service").values()
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8787, "targetPort": "http", "protocol": "TCP"}
    ]
    assert (
        service["spec"]["selector"]
        == deployments["knowledge-fs-api"]["spec"]["selector"]["matchLabels"]
    )
    for pod in _pods(resources).values():
        assert "hostNetwork" not in pod
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            assert not [p for p in container.get("ports", []) if "hostPort" in p]


def test_liveness_is_health_and_readiness_is_ready_fail_closed(resources):
    (api,) = _pods(resources)["knowledge-fs-api"]["containers"]
    assert api["ports"] == [{"name": "http", "containerPort": 8787, "protocol": "TCP"}]
    assert api["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    ready = api["readinessProbe"]
    assert ready["httpGet"] == {"path": "/ready", "port": "http"}
    # /ready waits at most 2.5 s; one failed or timed-out probe takes the pod out.
    assert ready["timeoutSeconds"] >= 3
    assert ready["failureThreshold"] == 1
    assert api["args"][:4] == ["gunicorn", "knowledgefs.wsgi", "--bind", "0.0.0.0:8787"]


def test_non_root_read_only_root_and_the_writable_paths_as_volumes(resources):
    for name, pod in _pods(resources).items():
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == 10001  # the Dockerfile's knowledgefs user
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["var"]["persistentVolumeClaim"] == {"claimName": "knowledge-fs-var"}
        assert "emptyDir" in volumes["tmp"] and "emptyDir" in volumes["run"]
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["capabilities"] == {"drop": ["ALL"]}
            assert {m["mountPath"] for m in container["volumeMounts"]} == WRITABLE, name
            assert {m["name"] for m in container["volumeMounts"]} == set(volumes)


def test_secrets_are_referenced_never_inlined(resources):
    (config,) = _by_kind(resources, "ConfigMap").values()
    assert not SECRETS & set(config["data"])
    assert forbidden_credentials(config["data"]) == []
    assert not _by_kind(resources, "Secret")  # the operator creates it
    for name, pod in _pods(resources).items():
        for container in pod["containers"]:
            env = {e["name"]: e for e in container["env"]}
            assert set(env) == SECRETS, name
            for variable, entry in env.items():
                assert "value" not in entry, variable
                assert entry["valueFrom"]["secretKeyRef"] == {
                    "name": "knowledge-fs",
                    "key": variable,
                }
            assert container["envFrom"] == [{"configMapRef": {"name": "knowledge-fs"}}]


def _bytes(quantity: str) -> int:
    units = {"Mi": 2**20, "Gi": 2**30}
    return int(quantity[:-2]) * units[quantity[-2:]]


def test_requests_and_limits_follow_the_sizing_section(resources):
    pods = _pods(resources)
    resources_of = {name: pod["containers"][0]["resources"] for name, pod in pods.items()}
    for name, r in resources_of.items():
        assert set(r) == {"requests", "limits"}, name
        assert _bytes(r["requests"]["memory"]) <= _bytes(r["limits"]["memory"]), name
    worker = resources_of["knowledge-fs-worker"]
    # Two worker processes at about 0.7 GiB each …
    assert _bytes(worker["requests"]["memory"]) >= 1.4 * 2**30
    # … plus two parse children capped at KNOWLEDGE_PARSER_MAX_MEMORY_MB (2 GiB) each.
    assert _bytes(worker["limits"]["memory"]) >= 1.4 * 2**30 + 2 * 2 * 2**30
    api = resources_of["knowledge-fs-api"]
    # Two gunicorn processes, each may reserve 192 MiB for uploads in flight.
    assert _bytes(api["limits"]["memory"]) >= 2 * 192 * 2**20 + 2**30
    grace = {name: pod.get("terminationGracePeriodSeconds") for name, pod in pods.items()}
    assert grace["knowledge-fs-worker"] >= 20 + 30  # the worker's shutdown grace, with room
