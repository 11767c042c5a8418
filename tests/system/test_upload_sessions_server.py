"""Upload sessions against a real gunicorn on loopback (ingestion.fallback_admission and
ingestion.upload_sessions): the small-fallback gate's FIFO, 429 and 408 read from the server's
own ``/health``, start-up refusals of its settings, and a kill -9 of the API between the object
write and completion on the simulated Dify (its storage the only place the bytes go).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import signal
import socket
import threading
import time
import uuid

import pytest

from ingestion.models import CompilationJob, Document, UploadSession
from knowledgefs.testing.dify_server import OBJECT, TEST_INNER_KEY, DifyTestServer
from tests.system.test_upload_admission import IDLE, SMALL, Gunicorn, _stored_files

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

MiB = 1024 * 1024
KiB = 1024
#: 1 MiB files, the fallback gate: 2 bodies at once, 1 MiB reserved (the per-file limit).
FALLBACK = {
    **SMALL,
    "KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_CONCURRENCY": "2",
    "KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES": str(MiB),
}


@pytest.fixture(autouse=True)
def same_model_as_the_server(settings):
    """The server embeds with the test embedder (knowledgefs.testing.cluster_settings)."""
    from knowledgefs.runtime import DEFAULT_MODEL_ID

    settings.KNOWLEDGE_EMBEDDING_MODELS = {
        DEFAULT_MODEL_ID: "knowledgefs.testing.cluster_support.SlowEmbedder"
    }


@pytest.fixture
def servers(object_storage, tmp_path):
    """Start gunicorn servers on the test database; all stopped at the end."""
    started: list[Gunicorn] = []

    def start(**env: str) -> Gunicorn:
        name = f"gunicorn-{len(started)}"
        server = Gunicorn(
            object_storage, tmp_path / f"{name}-spool", tmp_path / f"{name}.log", **env
        )
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.stop()


def fallback_state(server: Gunicorn) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read())["small_fallback_uploads"]
    finally:
        conn.close()


def wait_for(server: Gunicorn, condition, seconds: float = 15.0) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        state = fallback_state(server)
        if condition(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"the fallback gate never reached the state: {state}")
        time.sleep(0.05)


def call(server: Gunicorn, key: str, method: str, path: str, body=None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        payload = json.dumps(body).encode() if body is not None else b""
        conn.request(
            method,
            path,
            payload,
            {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        answer = conn.getresponse()
        raw = answer.read()
        return answer.status, json.loads(raw) if raw else {}
    finally:
        conn.close()


def text(label: str, size: int) -> bytes:
    line = f"{label} {uuid.uuid4().hex} upload session test line.\n".encode()
    return (line * (size // len(line) + 1))[:size]


def open_session(server: Gunicorn, key: str, space_id, data: bytes) -> str:
    status, body = call(
        server,
        key,
        "POST",
        f"/v1/knowledge-spaces/{space_id}/upload-sessions",
        {
            "file_name": "notes.txt",
            "content_type": "text/plain",
            "expected_size_bytes": len(data),
            "checksum_sha256": base64.b64encode(hashlib.sha256(data).digest()).decode(),
        },
    )
    assert status == 201, body
    return body["session"]["id"]


class RawBody:
    """A small-file request over a raw socket: headers first, the body as the test decides."""

    def __init__(self, server: Gunicorn, key: str, space_id, session_id: str, data: bytes):
        self.data = data
        self.sent = 0
        self.started = time.monotonic()
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        head = (
            f"POST /v1/knowledge-spaces/{space_id}/upload-sessions/{session_id}/small-file "
            "HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {key}\r\n"
            "Content-Type: application/octet-stream\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self.sock.sendall(head.encode())

    def send(self, count: int | None = None) -> None:
        end = len(self.data) if count is None else min(len(self.data), self.sent + count)
        self.sock.sendall(self.data[self.sent : end])
        self.sent = end

    def trickle_until(self, stop: threading.Event, step: float = 0.3) -> threading.Thread:
        def run() -> None:
            try:
                while not stop.wait(step):
                    self.send(1)
                self.send()
            except OSError:
                pass

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def response(self, timeout: float = 60) -> tuple[int, dict]:
        self.sock.settimeout(timeout)
        answer = http.client.HTTPResponse(self.sock)
        answer.begin()
        raw = answer.read()
        self.elapsed = time.monotonic() - self.started
        self.sock.close()
        return answer.status, json.loads(raw) if raw else {}


def test_fallback_gate_fifo_429_and_408_with_the_reservation_released(
    servers, api_key, space, object_storage
):
    server = servers(**FALLBACK)
    stop = threading.Event()
    slow_data = [text(name, 300 * KiB) for name in ("a", "b")]
    slow = [
        RawBody(server, api_key, space.id, open_session(server, api_key, space.id, d), d)
        for d in slow_data
    ]
    for request in slow:
        request.send(1024)
    senders = [request.trickle_until(stop) for request in slow]
    held = wait_for(server, lambda s: s["active"] == 2)
    assert held["reserved_bytes"] == 600 * KiB  # each its declared size, once

    third_data = text("c", 100 * KiB)
    third = RawBody(
        server, api_key, space.id, open_session(server, api_key, space.id, third_data), third_data
    )
    third.send()
    status, body = third.response()
    assert (status, body["code"]) == (429, "upload_admission_busy")
    assert IDLE - 0.2 <= third.elapsed < IDLE + 5, third.elapsed

    fourth_data = text("d", 100 * KiB)
    fourth_id = open_session(server, api_key, space.id, fourth_data)
    fourth = RawBody(server, api_key, space.id, fourth_id, fourth_data)
    fourth.send()
    wait_for(server, lambda s: s["waiting"] == 1)
    stop.set()  # the slow ones finish: the fourth gets its turn within its wait
    for request in slow:
        status, body = request.response()
        assert status == 200 and body["session"]["status"] == "completed", body
    status, body = fourth.response()
    assert status == 200 and body["session"]["status"] == "completed", body
    for sender in senders:
        sender.join(5)

    # a client that stops mid-body: 408 after the idle timeout, its place given back
    stalled_data = text("stalled", 200 * KiB)
    stalled_id = open_session(server, api_key, space.id, stalled_data)
    stalled = RawBody(server, api_key, space.id, stalled_id, stalled_data)
    stalled.send(100 * KiB)
    status, body = stalled.response()
    assert (status, body["code"]) == (408, "upload_timeout")
    assert body["details"]["deadline"] == "idle"
    state = wait_for(server, lambda s: s["active"] == 0 and s["reserved_bytes"] == 0)
    assert state["counters"]["timeout_idle"] == 1
    assert state["counters"]["refused_busy"] == 1
    assert state["counters"]["admitted"] == 4  # a, b, d and the stalled one
    assert UploadSession.objects.get(id=stalled_id).status == "ready"  # send it again later
    assert Document.objects.count() == 3
    # only the three documents' sources are stored: nothing of the 429 or the 408
    assert len(_stored_files(object_storage)) == 3


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_CONCURRENCY": "9"},
            "KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_CONCURRENCY=9 is outside the accepted "
            "range 1..8",
        ),
        (
            {"KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES": str(101 * MiB)},
            f"KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES={101 * MiB} is outside "
            "the accepted range 1..104857600",
        ),
        (
            {"KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES": str(10 * MiB)},
            f"KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES={10 * MiB} must be at "
            f"least the per-file limit KNOWLEDGE_UPLOAD_MAX_BYTES={15 * MiB}",
        ),
        (
            {"KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE": str(MiB)},
            f"KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE={MiB} must be at least the "
            f"per-file limit KNOWLEDGE_UPLOAD_MAX_BYTES={15 * MiB}",
        ),
        (
            {"KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE": "0"},
            "KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE=0 is outside the accepted "
            "range 1..1099511627776",
        ),
    ],
)
def test_out_of_range_fallback_settings_stop_start_up(tmp_path, variables, message):
    from tests.system.test_boundary import manage_check

    run = manage_check(tmp_path, **variables)
    assert run.returncode != 0
    assert message in run.stderr


def test_kill_9_between_the_object_write_and_complete_gives_one_document_one_job(
    servers, tmp_path, tenant
):
    """On the simulated Dify: the API stores the session's object (Dify holds its answer back)
    and is SIGKILLed before completing; a new API completes the session once."""
    from spaces.api_keys import create_api_key

    dify = DifyTestServer().start()
    try:
        env = {
            **FALLBACK,
            "KFS_TEST_DIFY_OBJECTS": "1",
            "KNOWLEDGE_MODEL_RUNTIME": "dify",
            "DIFY_INNER_API_URL": dify.url,
            "DIFY_INNER_API_KEY": TEST_INNER_KEY,
        }
        key = create_api_key(tenant)[1]
        first = servers(**env)
        status, space = call(first, key, "POST", "/v1/knowledge-spaces", {"name": "Dify"})
        assert status == 201, space
        status, chosen = call(
            first,
            key,
            "PUT",
            f"/v1/knowledge-spaces/{space['id']}/embedding-profile",
            {
                "plugin_id": "langgenius/openai",
                "provider": "openai",
                "model": "text-embedding-3-small",
            },
        )
        assert status == 200, chosen
        data = text("dify", 50 * KiB)
        session_id = open_session(first, key, space["id"], data)
        dify.add_fault("late_ack", OBJECT, seconds=30)
        request = RawBody(first, key, space["id"], session_id, data)
        request.send()
        deadline = time.monotonic() + 20
        while not any(k.endswith(f"/documents/{session_id}/source") for k in dify.objects):
            assert time.monotonic() < deadline, "the object never reached Dify's storage"
            time.sleep(0.05)
        os.killpg(first.process.pid, signal.SIGKILL)  # the object is written, nothing completed
        first.process.wait(timeout=10)
        request.sock.close()
        assert UploadSession.objects.get(id=session_id).status == "ready"
        assert Document.objects.count() == 0

        dify.clear_faults()
        second = servers(**env)
        for _ in range(2):  # complete, then complete again: the same answer
            status, body = call(
                second,
                key,
                "POST",
                f"/v1/knowledge-spaces/{space['id']}/upload-sessions/{session_id}/complete",
            )
            assert status == 200, body
            assert body["session"]["status"] == "completed"
            assert body["session"]["document_id"] == session_id
        assert Document.objects.count() == 1 and CompilationJob.objects.count() == 1
        document = Document.objects.get()
        assert body["session"]["compilation_job_id"] == str(CompilationJob.objects.get().id)
        assert dify.objects[document.storage_key].data == data  # the bytes are in Dify only
        assert not (tmp_path / "objects").exists() or not _stored_files(tmp_path / "objects")
    finally:
        dify.stop()


@pytest.mark.parametrize(
    ("environment", "pinned"), [({}, "True"), ({"MALLOC_MMAP_THRESHOLD_": "4096"}, "False")]
)
def test_the_api_process_returns_large_buffers_to_the_system(environment, pinned):
    """knowledgefs.wsgi pins glibc's mmap threshold (upload buffers are unmapped when freed),
    unless the operator set ``MALLOC_MMAP_THRESHOLD_``."""
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    run = subprocess.run(
        [sys.executable, "-c", "import knowledgefs.wsgi as w; print(w.MMAP_THRESHOLD_PINNED)"],
        cwd=Path(__file__).resolve().parents[2],
        env={**env, **environment, "DJANGO_SETTINGS_MODULE": "knowledgefs.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == pinned
