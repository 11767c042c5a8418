"""Upload sessions through the API (ingestion.upload_sessions): create, small-file, complete,
abort, the expiry sweep, idempotency and every kind of bad input, on real object storage."""

from __future__ import annotations

import base64
import hashlib
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from ingestion import fallback_admission, upload_sessions
from ingestion.models import CompilationJob, Document, UploadSession
from knowledgefs import storage
from knowledgefs.testing.fixtures import compile_all
from spaces.services import Principal, create_space

pytestmark = pytest.mark.django_db

TEXT = b"# Expenses\n\nTaxi receipts are reimbursed within thirty days of the trip.\n"


def checksum(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def base(space) -> str:
    return f"/v1/knowledge-spaces/{space.id}/upload-sessions"


def create(client, space, data: bytes = TEXT, key: str | None = None, **overrides):
    body = {
        "file_name": "expenses.md",
        "content_type": "text/markdown",
        "expected_size_bytes": len(data),
        "checksum_sha256": checksum(data),
        **overrides,
    }
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post(base(space), body, format="json", **headers)


def send(client, space, session_id: str, data: bytes, **extra):
    return client.generic(
        "POST",
        f"{base(space)}/{session_id}/small-file",
        data,
        content_type="application/octet-stream",
        **extra,
    )


def stored_files(root) -> list:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_a_session_uploads_completes_and_compiles(client, space, object_storage):
    created = create(client, space)
    assert created.status_code == 201, created.content
    session = created.json()["session"]
    assert session["mode"] == "small_fallback" and session["status"] == "ready"
    assert "checksum_sha256" not in session and "object_key" not in session
    assert UploadSession.objects.get().reserved_bytes == len(TEXT)

    done = send(client, space, session["id"], TEXT)
    assert done.status_code == 200, done.content
    session = done.json()["session"]
    assert session["status"] == "completed"
    assert session["document_id"] == session["id"]
    job = CompilationJob.objects.get()
    assert session["compilation_job_id"] == str(job.id)
    document = Document.objects.get()
    assert storage.read_object(document.storage_key, max_bytes=1024) == TEXT
    assert UploadSession.objects.get().reserved_bytes == 0

    compile_all()
    document.refresh_from_db()
    assert document.state == "published"
    # complete again replays the same result; nothing new is written
    again = client.post(f"{base(space)}/{session['id']}/complete")
    assert again.status_code == 200
    assert again.json()["session"]["compilation_job_id"] == str(job.id)
    assert Document.objects.count() == 1 and CompilationJob.objects.count() == 1
    assert len(stored_files(object_storage)) == 1


def test_wrong_checksum_is_422_and_stores_nothing(client, space, object_storage):
    session = create(client, space).json()["session"]
    other = TEXT.replace(b"thirty", b"twenty")
    response = send(client, space, session["id"], other)
    assert response.status_code == 422, response.content
    assert response.json()["code"] == "upload_integrity_mismatch"
    assert stored_files(object_storage) == []
    assert UploadSession.objects.get().status == "ready"


def test_more_bytes_than_declared_is_413_unread(client, space, object_storage):
    session = create(client, space).json()["session"]
    response = send(client, space, session["id"], TEXT + b"extra")
    assert response.status_code == 413, response.content
    assert response.json()["code"] == "upload_size_mismatch"
    assert response.json()["details"]["expected_bytes"] == len(TEXT)
    assert stored_files(object_storage) == []


def test_fewer_bytes_is_400_upload_incomplete(client, space, object_storage):
    session = create(client, space).json()["session"]
    response = send(client, space, session["id"], TEXT[:-5])
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "upload_incomplete"
    assert stored_files(object_storage) == []


def test_complete_before_any_bytes_is_409(client, space):
    session = create(client, space).json()["session"]
    response = client.post(f"{base(space)}/{session['id']}/complete")
    assert response.status_code == 409, response.content
    assert response.json()["code"] == "upload_not_received"
    assert UploadSession.objects.get().status == "ready"


def test_a_session_of_another_space_is_404(client, space, principal):
    other = create_space(principal, name="Other")
    session = create(client, space).json()["session"]
    for suffix in ("", "/small-file", "/complete", "/abort"):
        method = "GET" if not suffix else "POST"
        response = client.generic(method, f"{base(other)}/{session['id']}{suffix}", TEXT)
        assert response.status_code == 404, (suffix, response.content)
        assert response.json()["code"] == "upload_session_not_found"
    foreign = create_space(Principal(tenant_id="tenant-b"), name="B")
    assert create(client, foreign).status_code == 404


def test_idempotency_replay_same_file_and_other_size(client, space):
    first = create(client, space, key="k-1")
    assert first.status_code == 201
    replay = create(client, space, key="k-1")
    assert replay.status_code == 200
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.json()["session"]["id"] == first.json()["session"]["id"]
    other_size = create(client, space, key="k-1", expected_size_bytes=len(TEXT) + 1)
    assert other_size.status_code == 409, other_size.content
    assert other_size.json()["code"] == "idempotency_key_conflict"
    assert other_size.json()["details"]["field"] == "expected_size_bytes"
    assert UploadSession.objects.count() == 1


@pytest.mark.parametrize(
    ("overrides", "status", "code"),
    [
        ({"expected_size_bytes": 0}, 400, "invalid_size"),
        ({"expected_size_bytes": "12"}, 400, "invalid_size"),
        ({"expected_size_bytes": 15 * 1024 * 1024 + 1}, 413, "file_too_large"),
        ({"checksum_sha256": "not-base64"}, 400, "invalid_checksum"),
        ({"checksum_sha256": base64.b64encode(b"short").decode()}, 400, "invalid_checksum"),
        ({"file_name": "x" * 513}, 400, "invalid_filename"),
        ({"content_type": "t" * 256}, 400, "invalid_content_type"),
        ({"on_duplicate": "merge"}, 400, "invalid_on_duplicate"),
    ],
)
def test_bad_declarations(client, space, overrides, status, code):
    response = create(client, space, **overrides)
    assert response.status_code == status, response.content
    assert response.json()["code"] == code
    assert UploadSession.objects.count() == 0


def test_abort_deletes_the_object_and_releases_the_quota(client, space, object_storage):
    session = create(client, space).json()["session"]
    # bytes stored (a write whose completion never happened), then the client aborts
    row = UploadSession.objects.get()
    storage.put_object(row.object_key, TEXT)
    response = client.post(f"{base(space)}/{session['id']}/abort")
    assert response.status_code == 200
    assert response.json()["session"]["status"] == "aborted"
    assert stored_files(object_storage) == []
    assert UploadSession.objects.get().reserved_bytes == 0
    assert client.post(f"{base(space)}/{session['id']}/abort").status_code == 200
    assert client.post(f"{base(space)}/{session['id']}/complete").status_code == 409
    assert send(client, space, session["id"], TEXT).status_code == 409


def test_the_sweep_expires_sessions_and_deletes_their_objects(space, object_storage):
    declared = upload_sessions.Declared("a.md", "text/markdown", len(TEXT), checksum(TEXT))
    sessions = [upload_sessions.create_session(space, declared)[0] for _ in range(3)]
    for session in sessions:
        storage.put_object(session.object_key, TEXT)
    UploadSession.objects.filter(id__in=[s.id for s in sessions[:2]]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert upload_sessions.sweep_expired(batch=1)["expired"] == 1  # bounded batch
    assert upload_sessions.sweep_expired()["expired"] == 1
    statuses = {s.id: s.status for s in UploadSession.objects.all()}
    assert sorted(statuses.values()) == ["expired", "expired", "ready"]
    assert len(stored_files(object_storage)) == 1
    assert upload_sessions.reserved_bytes(space) == len(TEXT)
    # the job recovery schedule runs the sweep too
    from ingestion.tasks import recover_jobs

    assert recover_jobs()["upload_sessions_expired"] == 0


def test_a_failed_delete_keeps_the_quota_until_the_object_is_gone(space, monkeypatch):
    declared = upload_sessions.Declared("a.md", "text/markdown", len(TEXT), checksum(TEXT))
    session = upload_sessions.create_session(space, declared)[0]
    storage.put_object(session.object_key, TEXT)
    UploadSession.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    def refuse(key):
        raise OSError("storage down")

    monkeypatch.setattr(storage, "delete_object", refuse)
    assert upload_sessions.sweep_expired()["delete_failed"] == 1
    row = UploadSession.objects.get()
    assert row.status == "aborting" and row.reserved_bytes == len(TEXT)
    monkeypatch.undo()
    UploadSession.objects.update(updated_at=timezone.now() - timedelta(minutes=6))
    assert upload_sessions.sweep_expired()["aborted"] == 1
    assert UploadSession.objects.get().reserved_bytes == 0


def test_a_duplicate_fails_the_session_and_deletes_its_object(client, space, object_storage):
    first = create(client, space).json()["session"]
    assert send(client, space, first["id"], TEXT).json()["session"]["status"] == "completed"
    second = create(client, space).json()["session"]
    response = send(client, space, second["id"], TEXT)
    assert response.status_code == 409
    assert response.json()["code"] == "duplicate_document"
    row = UploadSession.objects.get(id=second["id"])
    assert row.status == "failed" and row.error_code == "duplicate_document"
    assert row.reserved_bytes == 0
    assert len(stored_files(object_storage)) == 1  # only the first document's source
    # replace: the existing document is compiled again, the session's own object removed
    third = create(client, space, on_duplicate="replace").json()["session"]
    done = send(client, space, third["id"], TEXT).json()["session"]
    assert done["status"] == "completed" and done["document_id"] == first["id"]
    assert len(stored_files(object_storage)) == 1


def test_complete_resumes_after_a_crash_between_write_and_complete(client, space):
    """The object was written and the process died before completion: complete admits it once;
    a session left ``completing`` resumes the same way."""
    session = create(client, space).json()["session"]
    row = UploadSession.objects.get()
    storage.put_object(row.object_key, TEXT)  # what small-file did before the kill
    UploadSession.objects.update(status="completing", row_version=2)
    response = client.post(f"{base(space)}/{session['id']}/complete")
    assert response.status_code == 200, response.content
    assert response.json()["session"]["status"] == "completed"
    assert client.post(f"{base(space)}/{session['id']}/complete").status_code == 200
    assert Document.objects.count() == 1 and CompilationJob.objects.count() == 1


def test_a_stored_object_that_does_not_match_fails_with_422(client, space, object_storage):
    session = create(client, space).json()["session"]
    storage.put_object(UploadSession.objects.get().object_key, TEXT[:-1] + b"?")
    response = client.post(f"{base(space)}/{session['id']}/complete")
    assert response.status_code == 422
    assert UploadSession.objects.get().status == "failed"
    assert stored_files(object_storage) == []


def test_small_fallback_gate_is_on_health(client, settings):
    body = client.get("/health").json()["small_fallback_uploads"]
    assert (
        body["max_concurrency"] == settings.KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_CONCURRENCY
    )
    assert body["max_reserved_bytes"] == 30 * 1024 * 1024
    assert body["active"] == 0 and body["reserved_bytes"] == 0
    from ingestion import upload_admission

    assert fallback_admission.GATE is not upload_admission.GATE  # its own gate


def test_a_create_past_the_spaces_reservation_limit_is_409_and_a_release_frees_room(
    client, space, principal, settings, object_storage
):
    settings.KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE = 2 * len(TEXT) + 10
    first = create(client, space).json()["session"]
    assert create(client, space).status_code == 201
    refused = create(client, space)
    assert refused.status_code == 409, refused.content
    body = refused.json()
    assert body["code"] == "upload_session_quota_exceeded"
    assert "KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE" in body["message"]
    assert body["details"] == {
        "limit_bytes": 2 * len(TEXT) + 10,
        "reserved_bytes": 2 * len(TEXT),
        "requested_bytes": len(TEXT),
    }
    assert UploadSession.objects.count() == 2
    assert upload_sessions.reserved_bytes(space) == 2 * len(TEXT)
    # a smaller declaration that fits is admitted; the limit is per space
    assert create(client, space, data=b"0123456789").status_code == 201
    other = create_space(principal, name="Other space")
    assert create(client, other).status_code == 201
    # an aborted session releases its reservation at once, and so does a completed one
    assert client.post(f"{base(space)}/{first['id']}/abort").status_code == 200
    third = create(client, space, data=b"Another note on taxis.\n")
    assert third.status_code == 201, third.content
    assert create(client, space).status_code == 409
    sent = send(client, space, third.json()["session"]["id"], b"Another note on taxis.\n")
    assert sent.json()["session"]["status"] == "completed", sent.content
    assert create(client, space).status_code == 201


def test_an_idempotent_replay_is_not_charged_twice(client, space, settings):
    settings.KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE = len(TEXT)
    assert create(client, space, key="k-1").status_code == 201
    assert create(client, space, key="k-1").status_code == 200  # the same session, no new room
    assert create(client, space, key="k-2").json()["code"] == "upload_session_quota_exceeded"


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_two_concurrent_creates_cannot_both_pass_the_limit(space, settings, monkeypatch):
    """Each create reads the space's total and then waits for the other before inserting: with
    the space locked, the second one reads only after the first committed, and is refused."""
    settings.KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE = len(TEXT) + 1
    barrier = threading.Barrier(2)
    real = upload_sessions.reserved_bytes

    def racing(space_):
        total = real(space_)
        try:
            barrier.wait(timeout=3)  # both inside the window at once, unless serialised
        except threading.BrokenBarrierError:
            pass
        return total

    monkeypatch.setattr(upload_sessions, "reserved_bytes", racing)
    declared = upload_sessions.parse_declaration(
        {
            "file_name": "expenses.md",
            "content_type": "text/markdown",
            "expected_size_bytes": len(TEXT),
            "checksum_sha256": checksum(TEXT),
        }
    )
    outcomes: list[str] = []

    def one() -> None:
        try:
            upload_sessions.create_session(space, declared)
            outcomes.append("created")
        except Exception as exc:  # noqa: BLE001 - the refusal is the outcome under test
            outcomes.append(getattr(exc, "code", repr(exc)))
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["created", "upload_session_quota_exceeded"]
    assert UploadSession.objects.count() == 1
    assert real(space) == len(TEXT)
