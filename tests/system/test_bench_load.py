"""bench/load/run.py: the loss audit finds every kind of lost document and counts the rest; the
corpus is real documents, each upload distinct; the verdict fails on anything but admissions."""

from __future__ import annotations

import hashlib
import importlib.util
import uuid
from pathlib import Path

import pytest

from ingestion.models import CompilationJob, Document, KnowledgeNode
from knowledgefs.testing.fixtures import compile_all, upload

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_load_run", ROOT / "bench" / "load" / "run.py")
load_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(load_run)

TEXTS = {
    "cats.txt": "Cats are small carnivorous mammals that purr and sleep most of the day.",
    "rockets.txt": "Rocket engines burn liquid oxygen and kerosene to produce thrust.",
    "bread.txt": "Sourdough bread rises slowly because wild yeast ferments the dough.",
    "tides.txt": "Tides rise and fall twice a day as the Moon pulls on the oceans.",
    "bees.txt": "Honey bees dance to tell the hive where the flowers are.",
}


def _read(client):
    def read(path: str):
        response = client.get(path)
        return response.status_code, response.json()

    return read


@pytest.mark.django_db
def test_audit_counts_published_and_names_each_lost_document(client, space):
    ids = {}
    for name, text in TEXTS.items():
        response = upload(client, space, name, text.encode())
        assert response.status_code == 202, response.content
        ids[name] = response.json()["document"]["id"]
    compile_all()
    assert set(Document.objects.filter(space=space).values_list("state", flat=True)) == {
        "published"
    }
    # Published, then its chunks vanish: lost.
    KnowledgeNode.objects.filter(document_id=ids["rockets.txt"]).delete()
    # A terminal verdict on bad input is accounted for; a server-side failure is lost.
    Document.objects.filter(id=ids["bread.txt"]).update(state="failed", error_code="corrupt_pdf")
    Document.objects.filter(id=ids["tides.txt"]).update(
        state="failed", error_code="internal_error", error_message="boom"
    )
    missing = str(uuid.uuid4())
    accepted = [
        {"document_id": ids[name], "filename": name}
        for name in ("cats.txt", "rockets.txt", "bread.txt", "tides.txt")
    ] + [{"document_id": missing, "filename": "never-stored.txt"}]

    report = load_run.audit(str(space.id), accepted, _read(client))

    assert report["accepted"] == 5
    assert report["published"] == 1
    assert report["failed_bad_input"] == {"corrupt_pdf": 1}
    assert report["failed_other"] == {"internal_error": 1}
    assert report["lost"] == 3
    reasons = {d["filename"]: d["reason"] for d in report["lost_documents"]}
    assert reasons == {
        "rockets.txt": "published: 0 nodes (1 recorded), 0 vectors",
        "tides.txt": "failed internal_error: boom",
        "never-stored.txt": "missing: API 404, database none",
    }
    # bees.txt was stored but never reported accepted (an upload in flight when Locust stopped).
    assert report["not_seen_accepted_by_a_client"] == [
        {"document_id": ids["bees.txt"], "filename": "bees.txt", "state": "published"}
    ]
    assert report["documents_in_database"] == 5
    assert report["stuck_jobs"] == 0
    assert report["jobs_by_run_state"] == {"succeeded": 5}


@pytest.mark.django_db
def test_audit_reports_a_live_job_as_stuck_and_its_document_as_not_terminal(client, space):
    response = upload(client, space, "cats.txt", TEXTS["cats.txt"].encode())
    document_id = response.json()["document"]["id"]
    job = CompilationJob.objects.get(document_id=document_id)  # queued, never compiled

    report = load_run.audit(
        str(space.id), [{"document_id": document_id, "filename": "cats.txt"}], _read(client)
    )

    assert report["stuck_jobs"] == 1
    assert report["lost_documents"] == [
        {
            "document_id": document_id,
            "filename": "cats.txt",
            "reason": f"not terminal: queued, job {job.run_state}",
        }
    ]


def test_corpus_is_real_documents_each_distinct():
    items, sources = load_run.corpus(seed=7)
    docs = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sources["docs_md"] == len(docs) and docs
    names = [item["name"] for item in items]
    assert len(names) == len(set(names))
    assert set(docs) <= set(names)
    assert sources["scifact_abstracts"] >= 200  # the fixture's 200, or the whole SciFact corpus
    digests = {
        hashlib.sha256(
            item["content"].encode() if "content" in item else Path(item["path"]).read_bytes()
        ).hexdigest()
        for item in items
    }
    assert len(digests) == len(items)  # no upload of the first round is a duplicate
    # The varied files are spread out: one in every eight of the first uploads.
    real = sources["docs_md"] + sources.get("sample_docs", 0)
    head = items[: real * 8]
    assert sum(1 for item in head if not item["name"].startswith("scifact-")) == real
    assert not items[0]["name"].startswith("scifact-")


def test_verdict_passes_admissions_and_fails_anything_else():
    summary = {
        "locust_exit": 0,
        "other_errors": 0,
        "admissions": {"429 upload_admission_busy": 3, "408 upload_timeout": 1},
        "documents": {"lost": 0, "stuck_jobs": 0, "accepted": 40},
        "log_alarms": {"serve.log": {"count": 0}},
    }
    assert load_run.verdict(summary) == []
    summary["other_errors"] = 2
    summary["documents"]["lost"] = 1
    summary["log_alarms"]["serve.log"]["count"] = 4
    assert load_run.verdict(summary) == [
        "2 responses other than 2xx or 429/408 admissions",
        "1 documents lost",
        "4 error lines in serve.log",
    ]
