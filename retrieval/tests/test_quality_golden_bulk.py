"""Golden questions in bulk (docs/quality.md): evidence matching by the space's dense index and
bulk import (API, ``kfs golden import``), on a real space compiled with the local model."""

from __future__ import annotations

import json
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from ingestion.documents import admit_document
from ingestion.models import KnowledgeNode
from knowledgefs.testing.fixtures import compile_all
from retrieval import golden
from retrieval.models import GoldenQuestion

pytestmark = pytest.mark.django_db

LEAVE = (
    "# Leave\n\nEvery employee gets 25 days of annual leave per year. Unused leave days expire "
    "at the end of March. Requests go to your manager two weeks ahead."
)
EXPENSES = (
    "# Expenses\n\nSubmit travel receipts within thirty days of the trip. Hotels above 200 euros "
    "a night need written approval."
)
GOOD = "Every employee gets 25 days of annual leave per year. Unused leave days expire in March."
UNRELATED = "Rocket engines burn liquid oxygen and kerosene to produce thrust."


@pytest.fixture
def corpus(space):
    for name, text in (("leave.md", LEAVE), ("expenses.md", EXPENSES)):
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    return space


def base(space) -> str:
    return f"/v1/knowledge-spaces/{space.id}/golden-questions"


def test_evidence_texts_match_the_chunk_that_holds_them(corpus, client):
    response = client.post(
        f"{base(corpus)}/evidence-matches",
        {"evidence_texts": [GOOD, UNRELATED], "top_k": 2},
        format="json",
    )
    assert response.status_code == 200, response.content
    good, unrelated = response.json()["items"]
    assert good["matched"] is True and unrelated["matched"] is False
    assert good["candidates"][0]["filename"] == "leave.md"
    assert good["candidates"][0]["score"] >= 0.7 > unrelated["candidates"][0]["score"]
    assert len(good["candidates"]) == 2


def test_node_ids_resolve_only_inside_the_space(corpus, client):
    node = KnowledgeNode.objects.filter(space=corpus).first()
    body = {"node_ids": [str(node.id), str(uuid.uuid4())]}
    result = client.post(f"{base(corpus)}/evidence-matches", body, format="json").json()
    assert [i["matched"] for i in result["items"]] == [True, False]
    assert result["resolved_evidence"] == [
        {"document_id": str(node.document_id), "node_id": str(node.id)}
    ]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"evidence_texts": ["x"] * 501}, "too_many_items"),
        ({"node_ids": [str(uuid.uuid4())] * 51}, "too_many_items"),
        ({"evidence_texts": ["x"], "node_ids": ["y"]}, "invalid_request"),
        ({}, "invalid_request"),
        ({"evidence_texts": ["x" * 8001]}, "invalid_evidence_texts"),
        ({"evidence_texts": ["x"], "minimum_similarity": 1.5}, "invalid_minimum_similarity"),
        ({"evidence_texts": ["x"], "top_k": 11}, "invalid_top_k"),
        ({"node_ids": ["not-a-node"]}, "invalid_node_ids"),
    ],
)
def test_bad_match_bodies_are_400(corpus, client, body, code):
    response = client.post(f"{base(corpus)}/evidence-matches", body, format="json")
    assert (response.status_code, response.json()["code"]) == (400, code), response.content


def test_matching_without_a_dense_index_is_503(space, client):
    response = client.post(
        f"{base(space)}/evidence-matches", {"evidence_texts": [GOOD]}, format="json"
    )
    assert response.status_code == 503
    assert response.json()["code"] == "evidence_matching_unavailable"


def test_bulk_import_makes_matched_rows_active_and_the_rest_draft(corpus, client):
    rows = [
        {"question": "How many leave days?", "evidence": GOOD, "tags": ["hr"]},
        {"question": "What fuels a rocket?", "evidence": UNRELATED},
    ]
    response = client.post(
        f"{base(corpus)}/bulk-import", {"rows": rows, "match_policy": "any"}, format="json"
    )
    assert response.status_code == 201, response.content
    result = response.json()
    assert (result["active_count"], result["draft_count"]) == (1, 1)
    active, draft = result["items"]
    assert active["status"] == "active" and active["similarity"] >= 0.7
    assert draft["status"] == "draft" and draft["similarity"] < 0.7
    question = GoldenQuestion.objects.get(id=active["question_id"])
    assert question.match_policy == "any" and question.tags == ["hr"]
    leave = KnowledgeNode.objects.get(id=active["expected_evidence_id"])
    assert question.expected_evidence[0]["document_id"] == str(leave.document_id)
    # the active question passes a golden run; the draft one is not run
    run = golden.run_golden(corpus, top_k=3)
    assert run["questions"] == 1 and run["passed"] == 1


def test_501_rows_are_refused_whole(corpus, client):
    rows = [{"question": f"q{n}", "evidence": GOOD} for n in range(501)]
    response = client.post(f"{base(corpus)}/bulk-import", {"rows": rows}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "too_many_items"
    assert "500" in response.json()["message"]
    assert not GoldenQuestion.objects.exists()


def test_one_bad_row_refuses_the_batch_naming_it(corpus, client):
    rows = [{"question": "ok", "evidence": GOOD}, {"question": "", "evidence": GOOD}]
    response = client.post(f"{base(corpus)}/bulk-import", {"rows": rows}, format="json")
    assert response.status_code == 400
    assert response.json()["details"] == {"row_index": 1}
    assert response.json()["message"].startswith("rows[1]:")
    assert not GoldenQuestion.objects.exists()


def test_kfs_golden_import_reads_csv_and_jsonl(corpus, tmp_path):
    csv_file = tmp_path / "golden.csv"
    csv_file.write_text(
        "question,evidence,tags,metadata\n"
        f'"How many leave days?","{GOOD}",hr|leave,"{{""owner"": ""hr""}}"\n',
        encoding="utf-8",
    )
    out = StringIO()
    call_command("kfs", "golden", "import", str(csv_file), "--space", corpus.slug,
                 "--tenant", "tenant-a", "--json", stdout=out)  # fmt: skip
    result = json.loads(out.getvalue())
    assert result["active_count"] == 1
    question = GoldenQuestion.objects.get(id=result["items"][0]["question_id"])
    assert question.tags == ["hr", "leave"] and question.metadata["owner"] == "hr"
    jsonl = tmp_path / "golden.jsonl"
    jsonl.write_text(json.dumps({"question": "Rockets?", "evidence": UNRELATED}) + "\n")
    out = StringIO()
    call_command("kfs", "golden", "import", str(jsonl), "--space", corpus.slug,
                 "--tenant", "tenant-a", stdout=out)  # fmt: skip
    assert "0 active, 1 draft" in out.getvalue()
    bad = tmp_path / "golden.txt"
    bad.write_text("x")
    with pytest.raises(CommandError, match="invalid_file: golden.txt: give a .csv or .jsonl"):
        call_command("kfs", "golden", "import", str(bad), "--space", corpus.slug,
                     "--tenant", "tenant-a")  # fmt: skip


def test_the_admin_upload_form_imports_a_file(corpus, admin_client):
    from django.core.files.uploadedfile import SimpleUploadedFile

    listing = admin_client.get("/admin/retrieval/goldenquestion/")
    assert b"/admin/retrieval/goldenquestion/import/" in listing.content
    rows = json.dumps({"question": "How many leave days?", "evidence": GOOD}) + "\n"
    response = admin_client.post(
        "/admin/retrieval/goldenquestion/import/",
        {
            "space": str(corpus.id),
            "file": SimpleUploadedFile("golden.jsonl", rows.encode()),
            "match_policy": "all",
            "minimum_similarity": "0.7",
        },
        follow=True,
    )
    assert b"Imported 1 golden questions: 1 active, 0 draft." in response.content
    assert GoldenQuestion.objects.get().status == "active"
    bad = admin_client.post(
        "/admin/retrieval/goldenquestion/import/",
        {"space": str(corpus.id), "file": SimpleUploadedFile("g.jsonl", b"[1]\n"),
         "match_policy": "all", "minimum_similarity": "0.7"},
    )  # fmt: skip
    assert b"invalid_file: line 1: each line must be a JSON object" in bad.content
    assert GoldenQuestion.objects.count() == 1
