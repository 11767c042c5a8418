"""``POST /v1/queries`` over real HTTP: gunicorn with sync workers on loopback.

Each test starts ``gunicorn knowledgefs.wsgi`` (one sync worker, the product's settings over the
test database: ``knowledgefs.testing.cluster_settings``) and reads the event stream as it arrives
with ``http.client``. The LLM tests point the server at the Dify contract server running in this
process (``knowledgefs/testing/dify_server.py``), whose scripted model answers and whose stall fault
holds the model's stream after its first frame, so a test can see deltas arrive before the answer
ends.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection, connections

from ingestion.documents import admit_document
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import LLM, TEST_INNER_KEY, envelope_frame
from knowledgefs.testing.fixtures import compile_all
from retrieval.models import AnswerTrace
from retrieval.tests.test_answers import EMBEDDER, EXPENSES, LEAVE, QUESTION, REASONER
from spaces.api_keys import create_api_key
from spaces.services import Principal, create_space

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

dify_server = dify_fixtures.dify_server
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def same_model_as_the_server(settings):
    """The server (knowledgefs.testing.cluster_settings) embeds with the test embedder: so does this
    process."""
    from knowledgefs.runtime import DEFAULT_MODEL_ID

    settings.KNOWLEDGE_EMBEDDING_MODELS = {
        DEFAULT_MODEL_ID: "knowledgefs.testing.cluster_support.SlowEmbedder"
    }


class SyncGunicorn:
    """``gunicorn knowledgefs.wsgi`` with one **sync** worker on a free loopback port."""

    def __init__(self, objects: Path, log: Path, **env: str) -> None:
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "knowledgefs.testing.cluster_settings",
            "KFS_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
            "KFS_TEST_OBJECTS": str(objects),
            "LOG_LEVEL": "WARNING",
            **env,
        }
        self.log = log
        with __import__("socket").socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process: subprocess.Popen | None = None

    def start(self) -> SyncGunicorn:
        connections.close_all()
        handle = open(self.log, "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "knowledgefs.wsgi", "--bind",
             f"127.0.0.1:{self.port}", "--workers", "1", "--worker-class", "sync",
             "--timeout", "60", "--no-control-socket"],
            cwd=ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"gunicorn exited: {self.log.read_text()[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                conn.getresponse().read()
                conn.close()
                return self
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"gunicorn did not answer: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)

    def query(self, key: str, body: dict):
        """POST /v1/queries; returns ``(response, connection)`` with the body unread."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request(
            "POST",
            "/v1/queries",
            body=json.dumps(body),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        return conn.getresponse(), conn


def read_events(response) -> list[tuple[str, dict, float]]:
    """Parse ``text/event-stream`` as it arrives: ``(event, data, arrival monotonic time)``."""
    events = []
    name, data = None, None
    while True:
        line = response.readline()
        if not line:
            return events
        line = line.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: ") :])
        elif line == "" and name is not None:
            events.append((name, data, time.monotonic()))
            name, data = None, None


@pytest.fixture
def servers(object_storage, tmp_path):
    started: list[SyncGunicorn] = []

    def start(**env: str) -> SyncGunicorn:
        server = SyncGunicorn(object_storage, tmp_path / f"gunicorn-{len(started)}.log", **env)
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def local_space(db):
    space = create_space(Principal(tenant_id="tenant-a"), name="Handbook")
    for name, text in (("leave.md", LEAVE), ("expenses.md", EXPENSES)):
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    return space


def test_an_extractive_answer_streams_deltas_then_done(servers, local_space):
    key = create_api_key("tenant-a")[1]
    server = servers()
    response, conn = server.query(key, {"space_id": str(local_space.id), "query": QUESTION})
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream"
    run_id = response.getheader("X-Query-Run-Id")
    events = read_events(response)
    conn.close()
    names = [name for name, _, _ in events]
    assert names[-1] == "answer.done" and names[:-1] == ["answer.delta"] * (len(names) - 1)
    assert len(names) >= 2
    done = events[-1][1]
    assert done["trace_id"] == run_id and done["finish_reason"] == "retrieval-evidence"
    assert "".join(data["delta"] for _, data, _ in events[:-1]) == done["answer"]
    assert done["answer"].startswith("Every employee gets 25 days of annual leave per year. [E1]")
    assert done["citations"][0]["citation"]["filename"] == "leave.md"
    assert all(data["trace_id"] == run_id for _, data, _ in events)
    trace = AnswerTrace.objects.get(id=run_id)
    assert trace.completed and trace.source == "service_api" and trace.requester_kind == "api_key"


def test_refusals_over_http_are_json_before_any_stream(servers, local_space):
    key = create_api_key("tenant-a")[1]
    server = servers()
    for body, status, code in (
        ({"space_id": str(local_space.id), "query": "leave", "mode": "warp"}, 400, "invalid_mode"),
        ({"space_id": str(local_space.id), "query": ""}, 400, "invalid_query"),
    ):
        response, conn = server.query(key, body)
        assert response.status == status
        assert response.getheader("Content-Type") == "application/json"
        assert json.loads(response.read())["code"] == code
        conn.close()
    response, conn = server.query("not-a-key", {"space_id": str(local_space.id), "query": "x"})
    assert response.status == 401  # authentication comes first
    assert json.loads(response.read())["code"] == "authentication_failed"
    conn.close()
    assert not AnswerTrace.objects.exists()


@pytest.fixture
def llm_setup(settings, dify_server, client):
    """A space with a Dify embedding and reasoning model, and a server using the same Dify."""
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    dify_server.dimension = 48
    space = create_space(Principal(tenant_id="tenant-a"), name="Reasoned")
    base = f"/v1/knowledge-spaces/{space.id}"
    for which, body in (("embedding", EMBEDDER), ("retrieval", {"reasoning_model": REASONER})):
        assert client.put(f"{base}/{which}-profile", body, format="json").status_code == 200
    ready = client.post(f"{base}/profile-validation").json()
    assert ready.get("readiness", {}).get("state") == "ready", ready
    for name, text in (("leave.md", LEAVE), ("expenses.md", EXPENSES)):
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    env = {
        "KNOWLEDGE_MODEL_RUNTIME": "dify",
        "DIFY_INNER_API_URL": dify_server.url,
        "DIFY_INNER_API_KEY": TEST_INNER_KEY,
    }
    return space, env


def _first_frame_end(answer: str) -> int:
    """Body bytes the contract server has sent when its LLM stream's first frame is complete.

    The server writes the frames' bytes as chunks of 7, 7, 7, 19 and the rest
    (knowledgefs/testing/dify_server.py ``_llm``); each chunk adds its hex length and two CRLFs.
    """
    third = max(len(answer) // 3, 1)
    first = envelope_frame({"delta": {"index": 0, "message": {"content": answer[:third]}}})
    framing = 3 * (1 + 2 + 7 + 2) + (2 + 2 + 19 + 2)
    rest = len(b"".join(_frames(answer))) - 40
    return framing + len(f"{rest:x}\r\n") + (len(first) - 40)


def _frames(answer: str) -> list[bytes]:
    third = max(len(answer) // 3, 1)
    parts = [answer[:third], answer[third : 2 * third], answer[2 * third :]]
    frames = [
        envelope_frame({"delta": {"index": i, "message": {"content": t}}})
        for i, t in enumerate(parts)
    ]
    frames[-1] = envelope_frame(
        {"delta": {"index": 2, "message": {"content": parts[-1]},
                   "finish_reason": "stop", "usage": {"prompt_tokens": 12,
                                                       "completion_tokens": 9}}}
    )  # fmt: skip
    return frames


def test_llm_deltas_arrive_as_the_model_streams(servers, llm_setup, dify_server):
    space, env = llm_setup
    text = "Employees get 25 days of annual leave per year [E1] [E9]."
    dify_server.llm_responder = lambda body: text
    dify_server.add_fault("stall", LLM, after_bytes=_first_frame_end(text), seconds=1.5)
    key = create_api_key("tenant-a")[1]
    server = servers(**env)
    response, conn = server.query(key, {"space_id": str(space.id), "query": QUESTION})
    assert response.status == 200
    events = read_events(response)
    conn.close()
    assert [n for n, _, _ in events][-1] == "answer.done"
    first_delta, done = events[0], events[-1]
    assert first_delta[0] == "answer.delta"
    assert first_delta[1]["delta"] == text[: len(text) // 3]
    assert done[2] - first_delta[2] >= 1.0  # the first delta left before the model finished
    assert done[1]["answer"] == "Employees get 25 days of annual leave per year [E1]."
    assert done[1]["orphan_markers"] == ["[E9]"]
    assert "".join(d["delta"] for n, d, _ in events if n == "answer.delta") == done[1]["answer"]


def test_an_llm_failure_over_http_is_an_answer_error_and_is_traced(servers, llm_setup, dify_server):
    space, env = llm_setup
    dify_server.llm_responder = lambda body: "Employees get 25 days of annual leave [E1]."
    dify_server.add_fault("frame_error", LLM, message="model overloaded")
    key = create_api_key("tenant-a")[1]
    server = servers(**env)
    response, conn = server.query(key, {"space_id": str(space.id), "query": QUESTION})
    assert response.status == 200  # the stream had started: the failure is an event
    run_id = response.getheader("X-Query-Run-Id")
    events = read_events(response)
    conn.close()
    name, payload, _ = events[-1]
    assert name == "answer.error"
    assert payload == {
        "error": {
            "code": "answer_generation_failed",
            "message": payload["error"]["message"],
            "cause": "MODEL_RUNTIME_ERROR",
        },
        "trace_id": run_id,
    }
    assert "MODEL_RUNTIME_ERROR" in payload["error"]["message"]
    assert [n for n, _, _ in events[:-1]] == ["answer.delta"] * (len(events) - 1)
    trace = AnswerTrace.objects.get(id=run_id)
    assert trace.completed and trace.error_code == "answer_generation_failed"
    assert trace.steps[-1]["name"] == "query.generate" and trace.steps[-1]["status"] == "error"


@pytest.mark.parametrize(
    "accept",
    [None, "text/event-stream", "text/*", "*/*", "application/json",
     "text/event-stream, application/json;q=0.5"],
)  # fmt: skip
def test_standard_sse_accept_headers_get_the_stream(servers, local_space, accept):
    key = create_api_key("tenant-a")[1]
    server = servers()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if accept is not None:
        headers["Accept"] = accept

    def post(body):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("POST", "/v1/queries", body=json.dumps(body), headers=headers)
        return conn.getresponse(), conn

    response, conn = post({"space_id": str(local_space.id), "query": QUESTION})
    assert response.status == 200, response.read()
    assert response.getheader("Content-Type") == "text/event-stream"
    assert [name for name, _, _ in read_events(response)][-1] == "answer.done"
    conn.close()
    response, conn = post({"space_id": str(local_space.id), "query": ""})  # refused: JSON
    assert response.status == 400
    assert response.getheader("Content-Type") == "application/json"
    assert json.loads(response.read())["code"] == "invalid_query"
    conn.close()


def test_an_accept_header_ruling_out_both_stream_and_json_is_406(servers, local_space):
    key = create_api_key("tenant-a")[1]
    server = servers()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request(
        "POST", "/v1/queries",
        body=json.dumps({"space_id": str(local_space.id), "query": QUESTION}),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json",
                 "Accept": "image/png"},
    )  # fmt: skip
    response = conn.getresponse()
    assert response.status == 406
    assert response.getheader("Content-Type") == "application/json"
    assert json.loads(response.read())["code"] == "not_acceptable"
    conn.close()


def read_raw(response) -> list[tuple[str, float]]:
    """Every line of the stream with its arrival time (comments included)."""
    lines = []
    while True:
        line = response.readline()
        if not line:
            return lines
        lines.append((line.decode().rstrip("\n"), time.monotonic()))


SIX = ["Employees ", "get 25 ", "days of ", "annual ", "leave ", "per year [E1]."]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip-middleware"])
def test_bc50_deltas_stream_one_by_one_uncompressed_and_unbuffered(
    servers, llm_setup, dify_server, gzip
):
    space, env = llm_setup
    dify_server.llm_responder = lambda body: SIX
    dify_server.llm_frame_gap = 1.0
    if gzip:
        env = {**env, "KFS_TEST_GZIP": "1"}
    server = servers(**env)
    key = create_api_key("tenant-a")[1]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    sent = time.monotonic()
    conn.request(
        "POST", "/v1/queries",
        body=json.dumps({"space_id": str(space.id), "query": QUESTION}),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json",
                 "Accept-Encoding": "gzip, deflate, br"},
    )  # fmt: skip
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream"
    assert response.getheader("Cache-Control") == "no-cache"
    assert response.getheader("X-Accel-Buffering") == "no"
    assert response.getheader("Content-Encoding") is None
    events = read_events(response)
    conn.close()
    deltas = [(data, at) for name, data, at in events if name == "answer.delta"]
    # One event per model delta (trailing spaces travel with the next delta).
    assert [d["delta"].strip() for d, _ in deltas] == [piece.strip() for piece in SIX]
    assert events[-1][0] == "answer.done"
    assert events[-1][1]["answer"] == "".join(SIX)
    # Retrieval and the model call before the first frame: well under the 1 s gaps that follow
    # on an idle machine; generous here (2 shared cores).
    assert deltas[0][1] - sent < 3.0
    gaps = [b - a for (_, a), (_, b) in zip(deltas, deltas[1:], strict=False)]
    assert all(0.6 < gap < 1.8 for gap in gaps), gaps  # each delta as the model sent it
    assert events[-1][2] - deltas[-1][1] < 1.0


@pytest.mark.timeout(60)
def test_bc50_a_silent_model_gets_heartbeats_at_a_fixed_interval(servers, llm_setup, dify_server):
    space, env = llm_setup
    dify_server.llm_responder = lambda body: ["Employees get 25 days ", "of leave [E1]."]
    dify_server.llm_frame_gap = [3.3]
    server = servers(**env, KNOWLEDGE_ANSWER_HEARTBEAT_SECONDS="1")
    key = create_api_key("tenant-a")[1]
    response, conn = server.query(key, {"space_id": str(space.id), "query": QUESTION})
    assert response.status == 200
    lines = read_raw(response)
    conn.close()
    text = [line for line, _ in lines]
    first = next(i for i, line in enumerate(text) if line == "event: answer.delta")
    second = next(i for i, line in enumerate(text) if i > first and line == "event: answer.delta")
    beats = [at for line, at in lines[first:second] if line == ": heartbeat"]
    assert len(beats) >= 2, text  # 3.3 s of silence, a heartbeat each second
    assert all(0.6 < b - a < 1.6 for a, b in zip(beats, beats[1:], strict=False)), beats
    assert [line for line in text if line.startswith("event: ")][-1] == "event: answer.done"


NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
error_log {prefix}/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            # proxy_buffering is left at its default (on): the response's X-Accel-Buffering: no
            # is what turns it off for the stream.
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Host $host;
        }}
    }}
}}
"""


@pytest.mark.timeout(60)
def test_bc50_through_nginx_with_default_proxy_buffering(servers, llm_setup, dify_server, tmp_path):
    import shutil
    import socket

    nginx = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if nginx is None:
        if os.environ.get("KFS_REQUIRE_NGINX"):
            pytest.fail("nginx is required (KFS_REQUIRE_NGINX=1): make nginx installs it")
        pytest.skip("nginx is not installed (make nginx)")
    space, env = llm_setup
    dify_server.llm_responder = lambda body: SIX
    dify_server.llm_frame_gap = 1.0
    server = servers(**env)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    conf = prefix / "nginx.conf"
    conf.write_text(NGINX_CONF.format(prefix=prefix, port=port, upstream=server.port))
    proxy = subprocess.Popen(
        [nginx, "-p", str(prefix), "-c", str(conf)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proxy.poll() is None, (prefix / "error.log").read_text()
                assert time.monotonic() < deadline, "nginx did not listen"
                time.sleep(0.1)
        key = create_api_key("tenant-a")[1]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        sent = time.monotonic()
        conn.request(
            "POST", "/v1/queries",
            body=json.dumps({"space_id": str(space.id), "query": QUESTION}),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json",
                     "Accept-Encoding": "gzip"},
        )  # fmt: skip
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type") == "text/event-stream"
        assert response.getheader("Cache-Control") == "no-cache"
        assert response.getheader("Content-Encoding") is None
        events = read_events(response)
        conn.close()
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
    deltas = [at for name, _, at in events if name == "answer.delta"]
    assert len(deltas) == 6 and events[-1][0] == "answer.done"
    assert deltas[0] - sent < 3.0
    gaps = [b - a for a, b in zip(deltas, deltas[1:], strict=False)]
    assert all(0.6 < gap < 1.8 for gap in gaps), gaps  # nginx passed each event on at once
