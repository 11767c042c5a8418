"""Durable replay runs (docs/quality.md): created over the API, delivered by the jobs kernel's
claim (this process plays the worker with the same entry point), frozen snapshot, pass/fail per
item with its evidence diff, cancel, retry on a fresh snapshot, the sweep's requeue keeping
finished items, and ``kfs quality replay --min-pass-rate``. Real database and local model."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from ingestion.documents import admit_document
from knowledgefs.testing.fixtures import compile_all
from retrieval.golden import create_question
from retrieval.models import IndexVersion, ReplayItem, ReplayRun
from retrieval.quality import replay_dispatch, replay_runner

pytestmark = pytest.mark.django_db

LEAVE = "# Leave\n\nEvery employee gets 25 days of annual leave per year."
PARKING = "# Parking\n\nStaff park on level two of the garage; visitors use level one."


@pytest.fixture
def corpus(space):
    admit_document(space, filename="leave.md", data=LEAVE.encode(), enqueue=False)
    compile_all()
    leave = create_question(
        space, {"question": "How many days of annual leave?",
                "expected_evidence": [{"text": "25 days of annual leave"}]},
    )  # fmt: skip
    parking = create_question(
        space, {"question": "Where do staff park?",
                "expected_evidence": [{"text": "park on level two"}]},
    )  # fmt: skip
    space.questions = (leave, parking)
    return space


def runs_url(space, *parts) -> str:
    return "/".join([f"/v1/knowledge-spaces/{space.id}/quality/replay-runs", *parts])


def create(client, space, body, capture, key=None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    with capture(execute=True):
        return client.post(runs_url(space), body, format="json", **headers)


def deliver(run_id) -> str:
    """What the worker does with the published message: the run's current claim."""
    run = ReplayRun.objects.get(id=run_id)
    assert run.task_id, "the run was not claimed before its message was published"
    return replay_runner.run_delivery(str(run.id), run.task_id)


def test_a_replay_fails_then_passes_once_the_missing_document_is_there(
    corpus, client, django_capture_on_commit_callbacks
):
    created = create(
        client, corpus, {"selection": "all-active"}, django_capture_on_commit_callbacks
    )
    assert created.status_code == 202, created.content
    run = created.json()
    assert (run["state"], run["mode"], run["summary"]["total"]) == ("queued", "fast", 2)
    assert run["provenance"]["projection"]["projection_version"] == 1
    assert run["provenance"]["embedding"]["model"]
    assert run["request_fingerprint"].startswith("sha256:")
    assert deliver(run["id"]) == "finished"
    body = client.get(runs_url(corpus, run["id"])).json()
    assert body["state"] == "failed" and body["error"] is None
    assert body["summary"] | {} == body["summary"]
    assert (body["summary"]["passed"], body["summary"]["failed"]) == (1, 1)
    leave, parking = body["items"]
    assert leave["state"] == "passed" and parking["state"] == "failed"
    diff = parking["result"]["evidence_diff"]
    assert (diff["expected_count"], diff["matched_count"], diff["missing_count"]) == (1, 0, 1)
    assert diff["evidence_items"][0]["text"] == "park on level two"
    assert parking["metrics"]["candidates"]["dense"] >= 1
    # the missing document arrives; a retry replays on a fresh snapshot
    admit_document(corpus, filename="parking.md", data=PARKING.encode(), enqueue=False)
    compile_all()
    with django_capture_on_commit_callbacks(execute=True):
        retried = client.post(
            runs_url(corpus, run["id"], "retry"), {"expected_revision": body["revision"]},
            format="json",
        )  # fmt: skip
    assert retried.status_code == 202, retried.content
    assert retried.json()["attempt"] == 2 and retried.json()["state"] == "queued"
    assert deliver(run["id"]) == "finished"
    again = client.get(runs_url(corpus, run["id"])).json()
    assert again["state"] == "passed" and again["summary"]["pass_rate"] == 1.0
    assert (
        again["provenance"]["projection"]["publication_revision"]
        > (run["provenance"]["projection"]["publication_revision"])
    )
    listed = client.get(runs_url(corpus) + "?state=passed").json()["results"]
    assert [r["id"] for r in listed] == [run["id"]] and "items" not in listed[0]


def test_idempotency_key_answers_the_same_run_or_409(
    corpus, client, django_capture_on_commit_callbacks
):
    ids = [str(q.id) for q in corpus.questions]
    first = create(client, corpus, {"golden_question_ids": ids}, django_capture_on_commit_callbacks,
                   key="replay-key-1")  # fmt: skip
    same = create(client, corpus, {"golden_question_ids": ids}, django_capture_on_commit_callbacks,
                  key="replay-key-1")  # fmt: skip
    assert same.status_code == 202 and same.json()["id"] == first.json()["id"]
    other = create(client, corpus, {"golden_question_ids": ids[:1]},
                   django_capture_on_commit_callbacks, key="replay-key-1")  # fmt: skip
    assert other.status_code == 409 and other.json()["code"] == "idempotency_key_reused"
    assert ReplayRun.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"golden_question_ids": [str(uuid.uuid4()) for _ in range(1001)]}, "too_many_items"),
        ({"golden_question_ids": [str(uuid.uuid4())]}, "unknown_golden_questions"),
        ({"golden_question_ids": ["nope"]}, "invalid_golden_question_ids"),
        ({"selection": "everything"}, "invalid_request"),
        ({"selection": "all-active", "mode": "auto"}, "invalid_mode"),
        ({}, "invalid_request"),
    ],
)
def test_bad_replay_requests_are_400(corpus, client, django_capture_on_commit_callbacks, body,
                                     code):  # fmt: skip
    response = create(client, corpus, body, django_capture_on_commit_callbacks)
    assert (response.status_code, response.json()["code"]) == (400, code), response.content
    assert not ReplayRun.objects.exists()


def test_a_deleted_frozen_index_version_fails_the_run_with_a_clear_code(
    corpus, client, django_capture_on_commit_callbacks
):
    run = create(client, corpus, {"selection": "all-active"}, django_capture_on_commit_callbacks)
    IndexVersion.objects.filter(space=corpus).delete()
    assert deliver(run.json()["id"]) == "failed"
    body = client.get(runs_url(corpus, run.json()["id"])).json()
    assert body["state"] == "failed"
    assert body["error"]["code"] == "frozen_snapshot_unavailable"
    assert "frozen index version 1" in body["error"]["message"]
    assert body["summary"]["completed"] == 0


def test_evidence_published_after_the_snapshot_is_left_out_even_mid_run(
    corpus, client, django_capture_on_commit_callbacks, monkeypatch
):
    from retrieval.modes import retrieve

    run = create(client, corpus, {"selection": "all-active"}, django_capture_on_commit_callbacks)
    frozen = ReplayRun.objects.get(id=run.json()["id"]).frozen_snapshot["publication"]
    assert frozen["documents"] == 1 and frozen["revision"] == 1 and frozen["frozen_at"]
    # the worker replays item 1 (leave); then, before item 2, the parking document that
    # answers item 2 is uploaded and published
    real = replay_runner.retrieve
    published = []

    def publish_after_the_first_item(*args, **kwargs):
        result = real(*args, **kwargs)
        if not published:
            admit_document(corpus, filename="parking.md", data=PARKING.encode(), enqueue=False)
            published.append(compile_all())
        return result

    monkeypatch.setattr(replay_runner, "retrieve", publish_after_the_first_item)
    assert deliver(run.json()["id"]) == "finished"
    assert published == [1]
    # the live space answers the parking question from the new document ...
    live = retrieve(corpus, "Where do staff park?", top_k=5, score_threshold=None)
    assert any(i.citation.get("filename") == "parking.md" for i in live.items)
    # ... but the run, frozen before it, did not read it
    body = client.get(runs_url(corpus, run.json()["id"])).json()
    leave, parking = body["items"]
    assert (leave["state"], parking["state"]) == ("passed", "failed")
    retrieved = [r["filename"] for r in parking["result"]["evidence_diff"]["retrieved"]]
    assert retrieved and "parking.md" not in retrieved
    assert parking["metrics"]["excluded_documents"] == 1
    assert parking["metrics"]["publication_revision"] == 2  # the head moved on
    assert body["summary"]["excluded_documents"] == 1
    assert body["summary"]["publication_drift"] == 1


@pytest.mark.parametrize("mode", ["deep", "research"])
def test_every_mode_reads_only_the_frozen_publication(
    corpus, client, django_capture_on_commit_callbacks, mode
):
    run = create(client, corpus, {"selection": "all-active", "mode": mode},
                 django_capture_on_commit_callbacks)  # fmt: skip
    admit_document(corpus, filename="parking.md", data=PARKING.encode(), enqueue=False)
    compile_all()
    assert deliver(run.json()["id"]) == "finished"
    body = client.get(runs_url(corpus, run.json()["id"])).json()
    assert body["mode"] == mode and body["error"] is None
    leave, parking = body["items"]
    assert (leave["state"], parking["state"]) == ("passed", "failed")
    assert "parking.md" not in [
        r["filename"] for r in parking["result"]["evidence_diff"]["retrieved"]
    ]


@pytest.mark.parametrize("change", ["replaced", "deleted"])
def test_a_deleted_or_replaced_frozen_generation_fails_the_run_with_a_clear_code(
    corpus, client, django_capture_on_commit_callbacks, change
):
    from ingestion.documents import delete_document, replace_document
    from ingestion.models import Document
    from spaces.services import Principal

    run = create(client, corpus, {"selection": "all-active"}, django_capture_on_commit_callbacks)
    document = Document.objects.get(space=corpus)
    if change == "replaced":
        replace_document(document, filename="leave.md", data=LEAVE.encode() + b" Or 26.",
                         enqueue=False)  # fmt: skip
        compile_all()
        assert Document.objects.get(id=document.id).active_revision.number == 2
    else:
        delete_document(Principal(tenant_id=corpus.tenant_id), corpus.id, document.id)
    assert deliver(run.json()["id"]) == "failed"
    body = client.get(runs_url(corpus, run.json()["id"])).json()
    assert body["error"]["code"] == "frozen_snapshot_unavailable"
    assert "1 of the 1 documents published at the frozen publication" in body["error"]["message"]
    assert body["summary"]["completed"] == 0


def test_cancel_is_compare_and_set_and_stops_the_delivery(
    corpus, client, django_capture_on_commit_callbacks
):
    run = create(client, corpus, {"selection": "all-active"}, django_capture_on_commit_callbacks)
    run_id = run.json()["id"]
    task_id = ReplayRun.objects.get(id=run_id).task_id
    stale = client.post(runs_url(corpus, run_id, "cancel"), {"expected_revision": 7},
                        format="json")  # fmt: skip
    assert stale.status_code == 409 and stale.json()["code"] == "revision_conflict"
    canceled = client.post(runs_url(corpus, run_id, "cancel"), {"expected_revision": 1},
                           format="json")  # fmt: skip
    assert canceled.json()["state"] == "canceled" and canceled.json()["revision"] == 2
    assert replay_runner.run_delivery(run_id, task_id) == "skipped"  # its message comes later
    assert not ReplayItem.objects.filter(run_id=run_id).exclude(state="pending").exists()
    again = client.post(runs_url(corpus, run_id, "cancel"), {"expected_revision": 2},
                        format="json")  # fmt: skip
    assert again.status_code == 409 and again.json()["code"] == "replay_run_finished"


def test_the_sweep_requeues_a_dead_delivery_and_keeps_finished_items(
    corpus, client, django_capture_on_commit_callbacks
):
    run = create(client, corpus, {"selection": "all-active"}, django_capture_on_commit_callbacks)
    run_id = run.json()["id"]
    row = ReplayRun.objects.get(id=run_id)
    assert replay_dispatch.QUEUE.begin(run_id, row.task_id) is not None  # a worker started it ...
    first = ReplayItem.objects.get(run_id=run_id, ordinal=1)
    ReplayItem.objects.filter(id=first.id).update(
        state="passed", result={"passed": True, "marker": "kept"}
    )  # ... finished item 1, and was killed
    ReplayRun.objects.filter(id=run_id).update(step_started_at=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        report = replay_dispatch.QUEUE.sweep()
    assert report.stale_requeued == 1 and report.dispatched == 1
    assert deliver(run_id) == "finished"
    items = {i.ordinal: i for i in ReplayItem.objects.filter(run_id=run_id)}
    assert items[1].result == {"passed": True, "marker": "kept"}  # not run again
    assert items[2].state == "failed" and items[2].result["evidence_diff"]
    assert ReplayRun.objects.get(id=run_id).attempt_count == 2


def test_runs_of_another_tenant_or_scope_are_404(corpus, client,
                                                 django_capture_on_commit_callbacks):  # fmt: skip
    from rest_framework.test import APIClient

    from spaces.api_keys import create_api_key

    run = create(client, corpus, {"selection": "all-active"}, django_capture_on_commit_callbacks)
    for tenant, spaces in (("tenant-b", None), ("tenant-a", [corpus])):
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key(tenant, spaces=spaces)[1]}")
        response = api.get(runs_url(corpus, run.json()["id"]))
        assert response.status_code == 404, (tenant, response.content)


@pytest.mark.django_db(transaction=True)  # the run is dispatched at its commit, as in production
def test_kfs_quality_replay_gates_on_the_pass_rate(corpus, monkeypatch):
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "SYNC", True)  # the published message runs in this process
    args = ["kfs", "quality", "replay", "--space", corpus.slug, "--tenant", "tenant-a",
            "--all-active", "--wait", "--json"]  # fmt: skip
    out = StringIO()
    call_command(*args, "--min-pass-rate", "0.5", stdout=out)
    assert json.loads(out.getvalue())["summary"]["pass_rate"] == 0.5
    out = StringIO()
    with pytest.raises(CommandError, match="pass rate 0.5 is below --min-pass-rate 0.9"):
        call_command(*args, "--min-pass-rate", "0.9", stdout=out)
    assert json.loads(out.getvalue())["state"] == "failed"  # the result is printed first
    with pytest.raises(CommandError, match="needs --wait"):
        call_command("kfs", "quality", "replay", "--space", corpus.slug, "--tenant", "tenant-a",
                     "--all-active", "--min-pass-rate", "0.5")  # fmt: skip
