"""Upload admission against a real gunicorn on loopback (ingestion.upload_admission, case BC-04).

Each test starts ``gunicorn knowledgefs.wsgi`` (one gthread worker, the product's settings over
the test database, small limits and deadlines in its environment) and talks to it over raw
sockets, so a client can stop sending mid-body, trickle bytes or send only its headers. What
the gate holds is read from the server's own ``/health`` (``uploads``).
"""

from __future__ import annotations

import http.client
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from django.db import connection, connections

from ingestion.models import CompilationJob, Document, KnowledgeNode
from knowledgefs.testing.fixtures import compile_all, multipart_body

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
KiB = 1024
#: The small server: 1 MiB files, 2 uploads at once, 3 MiB reserved, 2 s idle, 6 s in all.
SMALL = {
    "KNOWLEDGE_UPLOAD_MAX_BYTES": str(MiB),
    "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_CONCURRENCY": "2",
    "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES": str(3 * MiB),
    "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS": "2000",
    "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS": "6000",
}
IDLE = 2.0
TOTAL = 6.0


@pytest.fixture(autouse=True)
def same_model_as_the_server(settings):
    """The server (knowledgefs.testing.cluster_settings) embeds with the test embedder: so does this
    process."""
    from knowledgefs.runtime import DEFAULT_MODEL_ID

    settings.KNOWLEDGE_EMBEDDING_MODELS = {
        DEFAULT_MODEL_ID: "knowledgefs.testing.cluster_support.SlowEmbedder"
    }


class Gunicorn:
    """``gunicorn knowledgefs.wsgi`` on a free loopback port, in its own process group."""

    def __init__(self, objects: Path, spool: Path, log: Path, **env: str) -> None:
        spool.mkdir(parents=True, exist_ok=True)
        self.spool = spool
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "knowledgefs.testing.cluster_settings",
            "KFS_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
            "KFS_TEST_OBJECTS": str(objects),
            "TMPDIR": str(spool),  # where Django spools parts over 2 MiB
            "LOG_LEVEL": "WARNING",
            **env,
        }
        self.log = log
        self.port = _free_port()
        self.process: subprocess.Popen | None = None

    def start(self) -> Gunicorn:
        connections.close_all()
        handle = open(self.log, "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "knowledgefs.wsgi",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                "1",
                "--threads",
                "8",
                "--timeout",
                "120",
                "--no-control-socket",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"gunicorn exited: {self.log.read_text()[-2000:]}")
            try:
                self.uploads()
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

    def uploads(self) -> dict:
        """The server's ``/health`` ``uploads`` block (limits and the gate's state)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", "/health")
            return json.loads(conn.getresponse().read())["uploads"]
        finally:
            conn.close()

    def wait_for(self, condition, seconds: float = 10.0) -> dict:
        deadline = time.monotonic() + seconds
        while True:
            state = self.uploads()
            if condition(state):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"gate never reached the expected state: {state}")
            time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def servers(object_storage, tmp_path):
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


class RawUpload:
    """One upload over a raw socket: headers first, then the body as the test decides."""

    def __init__(
        self,
        server: Gunicorn,
        key: str,
        space,
        data: bytes,
        *,
        filename: str = "",
        declared: int | None = None,
        content_type: str | None = None,
    ) -> None:
        body, multipart_type = multipart_body(filename or f"{uuid.uuid4().hex}.txt", data)
        self.body = body
        self.sent = 0
        self.started = time.monotonic()
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        length = len(body) if declared is None else declared
        head = (
            f"POST /v1/knowledge-spaces/{space.id}/documents HTTP/1.1\r\n"
            "Host: 127.0.0.1\r\n"
            f"Authorization: Bearer {key}\r\n"
            f"Content-Type: {content_type or multipart_type}\r\n"
            f"Content-Length: {length}\r\n\r\n"
        )
        self.sock.sendall(head.encode())

    def send(self, count: int | None = None) -> None:
        """Send the next ``count`` body bytes (all the rest when None)."""
        end = len(self.body) if count is None else min(len(self.body), self.sent + count)
        self.sock.sendall(self.body[self.sent : end])
        self.sent = end

    def trickle_until(self, stop: threading.Event, step: float = 0.3) -> threading.Thread:
        """In a thread: one byte every ``step`` seconds until ``stop``, then the rest."""

        def run() -> None:
            try:
                while not stop.wait(step):
                    self.send(1)
                self.send()
            except OSError:
                pass  # the server answered and closed first

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def response(self, timeout: float = 30) -> tuple[int, dict, dict]:
        """``(status, headers, JSON body)`` of the answer; the time it came is ``self.elapsed``."""
        self.sock.settimeout(timeout)
        answer = http.client.HTTPResponse(self.sock)
        answer.begin()
        body = answer.read()
        self.elapsed = time.monotonic() - self.started
        self.sock.close()
        return answer.status, dict(answer.getheaders()), json.loads(body) if body else {}


def _text(label: str, size: int) -> bytes:
    """Unique readable text of ``size`` bytes (unique: no duplicate-upload 409)."""
    line = f"{label} {uuid.uuid4().hex} upload admission test line.\n".encode()
    return (line * (size // len(line) + 1))[:size]


def _stored_files(root: Path) -> list[Path]:
    """Files under ``root``, without the readiness probe's short-lived ``_probe/`` objects
    (``/health`` starts that check in the background)."""
    files: list[Path] = []
    # os.walk, not rglob: the probe's folder can vanish while it is read (the server deletes
    # its object and prunes the empty folder), and os.walk skips a folder that went away.
    for directory, folders, names in os.walk(root):
        if Path(directory) == root:
            folders[:] = [name for name in folders if name != "_probe"]
        files.extend(Path(directory) / name for name in names)
    return files


def _idle(state: dict) -> bool:
    return state["active"] == 0 and state["reserved_bytes"] == 0 and state["waiting"] == 0


def test_two_slow_uploads_hold_the_gate_a_third_gets_429_a_fourth_waits_its_turn(
    servers, api_key, space
):
    server = servers(**SMALL)
    stop = threading.Event()
    slow = [RawUpload(server, api_key, space, _text(name, 4 * KiB)) for name in ("a", "b")]
    for upload in slow:
        upload.send(1024)
    senders = [upload.trickle_until(stop) for upload in slow]
    held = server.wait_for(lambda s: s["active"] == 2)
    assert held["reserved_bytes"] == 3 * sum(len(u.body) for u in slow)

    third = RawUpload(server, api_key, space, _text("c", 2 * KiB))
    third.send()
    status, headers, body = third.response()
    assert (status, body["code"]) == (429, "upload_admission_busy")
    assert headers["Retry-After"] == "5"
    assert IDLE - 0.2 <= third.elapsed < IDLE + 3, third.elapsed  # it waited the idle timeout
    assert body["details"]["active"] == 2 and body["details"]["max_concurrency"] == 2

    fourth = RawUpload(server, api_key, space, _text("d", 2 * KiB))
    fourth.send()
    server.wait_for(lambda s: s["waiting"] == 1)
    stop.set()  # the slow ones finish: the fourth gets in within its wait
    for upload in slow:
        assert upload.response()[0] == 202
    status, _, body = fourth.response()
    assert status == 202, body
    for sender in senders:
        sender.join(5)
    state = server.wait_for(_idle)
    assert state["counters"]["refused_busy"] == 1
    assert state["counters"]["admitted"] == 3
    assert Document.objects.count() == 3


def test_reservation_arithmetic_refuses_what_does_not_fit(servers, api_key, space):
    server = servers(**SMALL)  # 3 MiB reserved, each upload reserves 3 x its body
    stop = threading.Event()
    holder = RawUpload(server, api_key, space, _text("holder", 600 * KiB))
    holder.send(1024)
    sender = holder.trickle_until(stop)
    state = server.wait_for(lambda s: s["active"] == 1)
    assert state["reserved_bytes"] == 3 * len(holder.body)  # about 1.8 MiB

    # 3 x (1 MiB + 60 KiB) is more than the 3 MiB total: it could never fit, refused at once.
    alone = RawUpload(server, api_key, space, b"", declared=MiB + 60 * KiB)
    status, _, body = alone.response()
    assert (status, body["code"]) == (413, "upload_reservation_too_large")
    assert body["details"] == {
        "reservation_bytes": 3 * (MiB + 60 * KiB),
        "max_reserved_bytes": 3 * MiB,
    }
    assert "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES" in body["message"]
    assert alone.elapsed < 5  # not queued: answered at once

    # 1.8 MiB held + 3 x 500 KiB = 3.3 MiB > 3 MiB: waits, then 429; its body is never read.
    waiting = RawUpload(server, api_key, space, _text("waiting", 500 * KiB))
    status, _, body = waiting.response()
    assert (status, body["code"]) == (429, "upload_admission_busy")
    assert waiting.elapsed >= IDLE - 0.2

    # 1.8 MiB + 3 x 300 KiB = 2.7 MiB fits beside the holder.
    fits = RawUpload(server, api_key, space, _text("fits", 300 * KiB))
    fits.send()
    assert fits.response()[0] == 202
    stop.set()
    assert holder.response()[0] == 202
    sender.join(5)
    state = server.wait_for(_idle)
    assert state["counters"]["refused_reservation_too_large"] == 1
    assert Document.objects.count() == 2  # the holder and the one that fitted


def test_a_client_that_stops_mid_body_gets_408_after_the_idle_timeout(
    servers, api_key, space, object_storage
):
    server = servers(**SMALL)
    stalled = RawUpload(server, api_key, space, _text("stalled", 200 * KiB))
    stalled.send(100 * KiB)
    status, _, body = stalled.response()
    assert (status, body["code"]) == (408, "upload_timeout")
    assert body["details"] == {
        "deadline": "idle",
        "timeout_ms": 2000,
        "received_bytes": 100 * KiB,  # what was sent, not the 64 KiB reads gunicorn completed
        "expected_bytes": len(stalled.body),
    }
    assert (
        "(idle deadline, KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS) "
        f"after {100 * KiB} of {len(stalled.body)} bytes" in body["message"]
    )
    assert IDLE - 0.2 <= stalled.elapsed < IDLE + 3, stalled.elapsed
    assert server.wait_for(_idle)["counters"]["timeout_idle"] == 1

    # The gate is free again and nothing of the stalled upload was kept.
    assert not _stored_files(object_storage)
    assert not Document.objects.exists()
    assert not _stored_files(server.spool)
    after = RawUpload(server, api_key, space, _text("after", 4 * KiB))
    after.send()
    assert after.response()[0] == 202
    assert Document.objects.count() == 1


def test_a_client_that_trickles_gets_408_at_the_total_deadline(servers, api_key, space):
    server = servers(**SMALL)
    stop = threading.Event()
    trickler = RawUpload(server, api_key, space, _text("trickle", 8 * KiB))
    trickler.send(1024)
    sender = trickler.trickle_until(stop, step=0.4)  # never idle for 2 s, never done
    status, _, body = trickler.response()
    sent = trickler.sent  # before stop: the sender then sends the rest
    stop.set()
    sender.join(5)
    assert (status, body["code"]) == (408, "upload_timeout")
    assert body["details"]["deadline"] == "total"
    assert body["details"]["timeout_ms"] == 6000
    # Every byte that reached the server is counted (a byte may be on its way as it answers).
    assert sent - 1 <= body["details"]["received_bytes"] <= sent, (sent, body["details"])
    assert body["details"]["received_bytes"] > 1024 + 10  # 1 KiB, then a byte every 0.4 s
    assert TOTAL - 0.2 <= trickler.elapsed < TOTAL + IDLE + 3, trickler.elapsed
    assert server.wait_for(_idle)["counters"]["timeout_total"] == 1
    assert not Document.objects.exists()


def test_a_small_body_stalled_half_way_counts_its_bytes_and_a_short_length_is_malformed(
    servers, api_key, space, object_storage
):
    server = servers(**SMALL)
    half = RawUpload(server, api_key, space, b"a small body", filename="small.txt")
    sent = len(half.body) // 2
    half.send(sent)
    status, _, body = half.response()
    assert (status, body["code"]) == (408, "upload_timeout")
    assert body["details"]["received_bytes"] == sent
    assert body["details"]["expected_bytes"] == len(half.body)
    assert f"after {sent} of {len(half.body)} bytes" in body["message"]

    # A Content-Length 20 bytes short of the body sent cuts off the closing boundary.
    data = _text("short", 4 * KiB)
    body_bytes, _ = multipart_body("short.txt", data)
    short = RawUpload(
        server, api_key, space, data, filename="short.txt", declared=len(body_bytes) - 20
    )
    short.send()
    status, _, body = short.response()
    assert (status, body["code"]) == (400, "malformed_request"), body
    assert body["message"] == (
        f"the multipart body ended after its declared Content-Length of {len(body_bytes) - 20} "
        "bytes without its closing boundary: the body is incomplete or malformed, or its "
        "Content-Length is smaller than the body sent; nothing is stored"
    )
    assert server.wait_for(_idle)["counters"]["timeout_idle"] == 1
    assert not Document.objects.exists()
    assert not _stored_files(object_storage)
    assert not _stored_files(server.spool)


def test_admission_is_released_after_413_and_after_errors(servers, api_key, space, object_storage):
    # 3 MiB files (over Django's 2 MiB memory threshold, so a part is spooled to a file).
    server = servers(
        **{
            **SMALL,
            "KNOWLEDGE_UPLOAD_MAX_BYTES": str(3 * MiB),
            "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES": str(16 * MiB),
        }
    )
    # Declared above 3 MiB + 64 KiB: refused before a byte of the body is read.
    declared = RawUpload(server, api_key, space, b"", declared=4 * MiB)
    status, _, body = declared.response()
    assert (status, body["code"]) == (413, "file_too_large")
    assert "upload limit of 3145728 bytes (3 MiB)" in body["message"]
    assert body["details"] == {"limit_bytes": 3 * MiB, "declared_bytes": 4 * MiB}

    # Within the envelope but the file itself is over 3 MiB: cut off while read.
    over = RawUpload(server, api_key, space, _text("over", 3 * MiB + 100))
    over.send()
    status, _, body = over.response()
    assert (status, body["code"]) == (413, "file_too_large")
    assert "upload limit of 3145728 bytes (3 MiB)" in body["message"]

    # The client closes its side half-way: 400 upload_incomplete.
    gone = RawUpload(server, api_key, space, _text("gone", 64 * KiB))
    gone.send(10 * KiB)
    gone.sock.shutdown(socket.SHUT_WR)
    status, _, body = gone.response()
    assert (status, body["code"]) == (400, "upload_incomplete")
    assert body["details"] == {"received_bytes": 10 * KiB, "expected_bytes": len(gone.body)}

    # A multipart body without a boundary, and a refusal raised after the body was read.
    broken = RawUpload(server, api_key, space, b"x", content_type="multipart/form-data")
    broken.send()
    status, _, body = broken.response()
    assert (status, body["code"]) == (400, "malformed_request")
    assert "multipart" in body["message"]
    empty = RawUpload(server, api_key, space, b"")
    empty.send()
    assert empty.response()[2]["code"] == "empty_file"

    state = server.wait_for(_idle)
    assert state["counters"]["refused_declared_too_large"] == 1
    assert state["counters"]["incomplete"] == 1
    assert not _stored_files(object_storage)
    assert not _stored_files(server.spool)  # the spooled part of the 413 is gone
    assert not Document.objects.exists()
    ok = RawUpload(server, api_key, space, _text("ok", 4 * KiB))
    ok.send()
    assert ok.response()[0] == 202


# --- BC-04: one 30 MB setting drives the check, the body limit and what clients are told -------

BC04_LIMIT = 30 * MiB
BC04_TOKEN = "Quarterly logistics report QUOKKA-2046 with an embedded survey photograph"


def _padded_pdf(size: int, token: str) -> bytes:
    """A one-page reportlab PDF of at least ``size`` bytes: text plus a random-noise image
    (noise does not compress, so the image stream is about its raw RGB size)."""
    from PIL import Image
    from reportlab import rl_config
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    side = int((size / 3) ** 0.5) + 8
    noise = Image.frombytes("RGB", (side, side), os.urandom(side * side * 3))
    buffer = io.BytesIO()
    previous = rl_config.useA85
    rl_config.useA85 = 0  # binary streams: the file is about the image's size, and fast to make
    try:
        page = canvas.Canvas(buffer, pagesize=A4)
        page.setFont("Helvetica", 14)
        page.drawString(72, 780, token)
        page.drawString(72, 760, "The photograph below is part of the survey appendix.")
        page.drawImage(ImageReader(noise), 72, 200, width=450, height=450)
        page.showPage()
        page.save()
    finally:
        rl_config.useA85 = previous
    data = buffer.getvalue()
    assert data.startswith(b"%PDF") and len(data) >= size
    return data


def test_bc04_a_30_mib_limit_takes_20_mib_and_refuses_31_mib(
    servers, api_key, space, object_storage
):
    server = servers(KNOWLEDGE_UPLOAD_MAX_BYTES=str(BC04_LIMIT))
    limits = server.uploads()
    assert limits["max_file_bytes"] == BC04_LIMIT  # what a client or UI is told
    assert limits["max_body_bytes"] == BC04_LIMIT + 64 * KiB

    twenty = _padded_pdf(20 * MiB, BC04_TOKEN)
    assert 20 * MiB <= len(twenty) < 21 * MiB
    upload = RawUpload(server, api_key, space, twenty, filename="survey-20mb.pdf")
    upload.send()
    status, _, body = upload.response(timeout=120)
    assert status == 202, body
    document_id = body["document"]["id"]

    thirty_one = _padded_pdf(31 * MiB, "too large")
    refused = RawUpload(server, api_key, space, thirty_one, filename="survey-31mb.pdf")
    status, _, body = refused.response()  # answered from the headers alone
    assert (status, body["code"]) == (413, "file_too_large")
    assert "exceeds the upload limit of 31457280 bytes (30 MiB)" in body["message"]
    assert body["details"]["limit_bytes"] == BC04_LIMIT
    assert body["details"]["declared_bytes"] == len(refused.body)
    assert refused.elapsed < 5

    # Only the 20 MiB document exists and only its bytes are stored.
    assert list(Document.objects.values_list("filename", flat=True)) == ["survey-20mb.pdf"]
    stored = _stored_files(object_storage)
    assert [p.stat().st_size for p in stored] == [len(twenty)]

    compile_all()
    document = Document.objects.get(id=document_id)
    assert document.state == "published", (document.state, document.error_code)
    assert CompilationJob.objects.get(document=document).stage == "published"
    texts = " ".join(KnowledgeNode.objects.filter(document=document).values_list("text", flat=True))
    assert "QUOKKA-2046" in texts
    assert server.wait_for(_idle)["counters"]["refused_declared_too_large"] == 1


# --- start-up validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_CONCURRENCY": "9"},
            "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_CONCURRENCY=9 is outside the accepted range "
            "1..8",
        ),
        (
            {"KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES": "1000"},
            "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES=1000 is outside the accepted "
            "range 1048576..4294967296",
        ),
        (
            {"KNOWLEDGE_UPLOAD_MAX_BYTES": str(51 * MiB)},
            f"KNOWLEDGE_UPLOAD_MAX_BYTES={51 * MiB} is outside the accepted range 1..52428800",
        ),
        (
            {
                "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS": "30000",
                "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS": "20000",
            },
            "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS=20000 must be at least "
            "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS=30000; accepted range "
            "30000..3600000",
        ),
        (
            {"KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS": "50"},
            "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS=50 is outside the accepted range "
            "100..600000",
        ),
    ],
)
def test_out_of_range_admission_settings_stop_start_up(tmp_path, variables, message):
    from tests.system.test_boundary import manage_check

    run = manage_check(tmp_path, **variables)
    assert run.returncode != 0
    assert message in run.stderr


def test_without_a_socket_the_idle_deadline_is_checked_between_reads(settings):
    """Outside gunicorn (no ``gunicorn.socket``) a read that took longer than the idle
    interval is refused once it returns."""
    from ingestion.upload_admission import DeadlineStream
    from knowledgefs.errors import RequestTimeout

    settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS = 200

    class SlowBody(io.BytesIO):
        def read(self, *args):
            time.sleep(0.3 if self.tell() else 0)
            return super().read(*args)

    stream = DeadlineStream(SlowBody(b"x" * 100), 100)
    assert stream.read(10) == b"x" * 10
    with pytest.raises(RequestTimeout) as raised:
        stream.read(10)
    assert raised.value.details["deadline"] == "idle"
    assert raised.value.details["received_bytes"] == 10


def test_the_gate_admits_in_arrival_order(settings):
    """A large upload at the head of the queue is not overtaken by a small one that would fit:
    both are admitted in arrival order once the holder leaves."""
    from ingestion.upload_admission import AdmissionGate

    settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_CONCURRENCY = 3
    settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES = 3 * MiB
    gate = AdmissionGate()
    holder = gate.acquire(2 * MiB, wait_seconds=0)
    admitted: list[str] = []

    def enter(name: str, size: int) -> None:
        gate.acquire(size, wait_seconds=10)
        admitted.append(name)

    large = threading.Thread(target=enter, args=("large", 2 * MiB))
    large.start()
    while gate.snapshot()["waiting"] < 1:
        time.sleep(0.01)
    small = threading.Thread(target=enter, args=("small", MiB // 2))  # would fit beside holder
    small.start()
    while gate.snapshot()["waiting"] < 2:
        time.sleep(0.01)
    time.sleep(0.2)
    assert admitted == []  # the small one waits behind the large one
    gate.release(holder)
    large.join(5)
    small.join(5)
    assert admitted == ["large", "small"]
    assert gate.snapshot()["active"] == 2
    assert gate.snapshot()["reserved_bytes"] == 2 * MiB + MiB // 2
