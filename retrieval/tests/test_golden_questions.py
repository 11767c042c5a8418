"""Golden questions: CRUD over HTTP, limits with their codes, tenant isolation, and a scored run
(``kfs eval --golden``) over a small compiled corpus, with its regression gate."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from ingestion.documents import admit_document
from knowledgefs.testing.fixtures import compile_all
from retrieval.golden import create_question, run_golden, update_question
from spaces.api_keys import create_api_key
from spaces.services import Principal, create_space

pytestmark = pytest.mark.django_db


def url(space, question_id=None) -> str:
    base = f"/v1/knowledge-spaces/{space.id}/golden-questions"
    return f"{base}/{question_id}" if question_id else base


@pytest.fixture
def corpus(space):
    texts = {
        "cats.txt": "Cats are small carnivorous mammals that purr and sleep most of the day.",
        "rockets.txt": "Rocket engines burn liquid oxygen and kerosene to produce thrust.",
        "bread.txt": "Sourdough bread rises slowly because wild yeast ferments the dough.",
    }
    docs = {
        name: admit_document(space, filename=name, data=text.encode(), enqueue=False).document
        for name, text in texts.items()
    }
    compile_all()
    return space, {name: str(doc.id) for name, doc in docs.items()}


def test_crud_over_http_with_revisions(client, corpus):
    space, docs = corpus
    body = {
        "question": "  Why do cats purr?  ",
        "expected_evidence": [{"document_id": docs["cats.txt"].upper(), "text": "purr and sleep"}],
        "tags": ["animals", "animals", " behaviour "],
        "metadata": {"owner": "qa"},
    }
    created = client.post(url(space), body, format="json")
    assert created.status_code == 201, created.content
    question = created.json()
    assert created["ETag"] == '"1"'
    assert question["question"] == "Why do cats purr?"
    assert question["expected_evidence"] == [
        {"document_id": docs["cats.txt"], "text": "purr and sleep"}
    ]
    assert question["tags"] == ["animals", "behaviour"]
    assert question["revision"] == 1 and question["space_id"] == str(space.id)

    second = client.post(
        url(space),
        {"question": "Rockets?", "expected_evidence": [{"text": "thrust"}]},
        format="json",
    ).json()
    page = client.get(url(space) + "?limit=1").json()
    assert [q["id"] for q in page["results"]] == [second["id"]]
    assert page["next"] is not None
    rest = client.get(page["next"]).json()
    assert [q["id"] for q in rest["results"]] == [question["id"]]

    detail = client.get(url(space, question["id"]))
    assert detail.status_code == 200 and detail.json() == question

    patched = client.patch(
        url(space, question["id"]), {"tags": ["cats"]}, format="json", HTTP_IF_MATCH='"1"'
    )
    assert patched.status_code == 200, patched.content
    assert patched.json()["tags"] == ["cats"] and patched.json()["revision"] == 2
    assert patched.json()["question"] == "Why do cats purr?"
    assert patched["ETag"] == '"2"'
    stale = client.patch(
        url(space, question["id"]), {"tags": ["dogs"]}, format="json", HTTP_IF_MATCH='"1"'
    )
    assert stale.status_code == 409
    assert stale.json()["code"] == "revision_conflict"
    assert "at revision 2, not 1" in stale.json()["message"]
    by_body = client.patch(
        url(space, question["id"]), {"revision": 2, "metadata": {}}, format="json"
    )
    assert by_body.status_code == 200 and by_body.json()["revision"] == 3
    bad_header = client.patch(url(space, question["id"]), {}, format="json", HTTP_IF_MATCH="x")
    assert bad_header.json()["code"] == "invalid_revision"

    assert client.delete(url(space, question["id"])).status_code == 204
    gone = client.get(url(space, question["id"]))
    assert gone.status_code == 404 and gone.json()["code"] == "golden_question_not_found"
    assert client.delete(url(space, question["id"])).status_code == 404


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        ({"question": "", "expected_evidence": [{"text": "x"}]}, "invalid_question", "non-empty"),
        (
            {"question": "q" * 4001, "expected_evidence": [{"text": "x"}]},
            "invalid_question",
            "question is 4001 characters; the limit is 4000",
        ),
        ({"question": "q", "expected_evidence": []}, "invalid_expected_evidence", "non-empty"),
        (
            {"question": "q", "expected_evidence": [{"text": "x"}] * 51},
            "invalid_expected_evidence",
            "expected_evidence has 51 items; the limit is 50",
        ),
        (
            {"question": "q", "expected_evidence": [{"page": 1}]},
            "invalid_expected_evidence",
            "expected_evidence[0] must be an object with document_id, node_id and/or text",
        ),
        (
            {"question": "q", "expected_evidence": [{"text": "x", "page": 1}]},
            "invalid_expected_evidence",
            "expected_evidence[0] has unknown keys: page",
        ),
        (
            {"question": "q", "expected_evidence": [{"text": "x"}, {"node_id": "nope"}]},
            "invalid_expected_evidence",
            "expected_evidence[1].node_id must be a UUID",
        ),
        (
            {
                "question": "q",
                "expected_evidence": [{"document_id": "00000000-0000-4000-8000-000000000000"}],
            },
            "invalid_expected_evidence",
            "is not a document of this space",
        ),
        (
            {"question": "q", "expected_evidence": [{"text": "x" * 2001}]},
            "invalid_expected_evidence",
            "expected_evidence[0].text is 2001 characters; the limit is 2000",
        ),
        (
            {
                "question": "q",
                "expected_evidence": [{"text": "x"}],
                "tags": [f"t{i}" for i in range(21)],
            },
            "invalid_tags",
            "tags has 21 distinct entries; the limit is 20",
        ),
        (
            {"question": "q", "expected_evidence": [{"text": "x"}], "tags": ["ok", "t" * 81]},
            "invalid_tags",
            "tags[1] is 81 characters; the limit is 80",
        ),
        (
            {"question": "q", "expected_evidence": [{"text": "x"}], "metadata": [1]},
            "invalid_metadata",
            "metadata must be a JSON object",
        ),
        (
            {"question": "q", "expected_evidence": [{"text": "x"}], "metadata": {"a": "x" * 70000}},
            "invalid_metadata",
            "the limit is 65536",
        ),
        (
            {"question": "q", "expected_evidence": [{"text": "x"}], "answer": "no"},
            "invalid_request",
            "unknown members: answer",
        ),
    ],
)
def test_bad_bodies_name_the_field_and_the_limit(client, space, body, code, message):
    response = client.post(url(space), body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code
    assert message in response.json()["message"]
    assert not space.golden_questions.exists()


def test_a_tag_of_exactly_80_and_20_tags_are_accepted(client, space):
    tags = ["t" * 80] + [f"tag{i}" for i in range(19)]
    response = client.post(
        url(space),
        {"question": "q" * 4000, "expected_evidence": [{"text": "x"}], "tags": tags},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["tags"] == tags


def test_the_per_space_limit_is_a_409(client, space, settings):
    settings.KNOWLEDGE_GOLDEN_MAX_QUESTIONS_PER_SPACE = 1
    body = {"question": "q", "expected_evidence": [{"text": "x"}]}
    assert client.post(url(space), body, format="json").status_code == 201
    refused = client.post(url(space), body, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "golden_question_limit"
    assert space.golden_questions.count() == 1


def test_other_tenants_and_other_spaces_get_404(client, space):
    question = create_question(space, {"question": "mine?", "expected_evidence": [{"text": "x"}]})
    other_tenant = APIClient()
    other_tenant.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-b')[1]}")
    for method in ("get", "patch", "delete"):
        response = getattr(other_tenant, method)(
            url(space, question.id), {"tags": ["x"]}, format="json"
        )
        assert response.status_code == 404 and response.json()["code"] == "space_not_found"
    listed = other_tenant.get(url(space))
    assert listed.status_code == 404 and listed.json()["code"] == "space_not_found"
    sibling = create_space(Principal(tenant_id="tenant-a"), name="Sibling")
    response = client.get(url(sibling, question.id))
    assert response.status_code == 404 and response.json()["code"] == "golden_question_not_found"
    assert client.get(url(sibling)).json()["results"] == []
    assert client.get(url(space, "not-a-uuid")).json()["code"] == "golden_question_not_found"
    question.refresh_from_db()
    assert question.tags == [] and question.revision == 1


def test_golden_run_scores_hits_misses_and_ranks(corpus):
    space, docs = corpus
    create_question(
        space,
        {
            "question": "Why do cats purr and sleep all day?",
            "expected_evidence": [
                {"document_id": docs["cats.txt"], "text": "PURR  and\nsleep"},
                {"text": "carnivorous mammals"},
            ],
            "tags": ["animals"],
        },
    )
    create_question(
        space,
        {
            "question": "How do rocket engines produce thrust?",
            "expected_evidence": [{"document_id": docs["bread.txt"]}],
        },
    )
    run = run_golden(space, mode="fast", top_k=1)
    assert run["kind"] == "golden" and run["mode"] == "fast" and run["top_k"] == 1
    assert run["questions"] == 2 and run["passed"] == 1
    assert run["hit_rate@1"] == 0.5 and run["recall@1"] == 0.5 and run["mrr@1"] == 0.5
    cats, rockets = run["results"]
    assert cats["pass"] is True and cats["first_hit_rank"] == 1 and cats["missed"] == []
    assert [f["rank"] for f in cats["found"]] == [1, 1]
    assert rockets["pass"] is False and rockets["first_hit_rank"] is None
    assert rockets["missed"] == [{"document_id": docs["bread.txt"]}]
    wider = run_golden(space, mode="fast", top_k=3)
    assert wider["hit_rate@3"] == 1.0 and wider["passed"] == 2
    assert wider["results"][1]["found"][0]["rank"] > 1
    tagged = run_golden(space, mode="fast", top_k=1, tags=["animals"])
    assert tagged["questions"] == 1 and tagged["hit_rate@1"] == 1.0


def test_kfs_eval_golden_with_its_gate(corpus, tmp_path, capsys):
    space, docs = corpus
    create_question(
        space,
        {"question": "sourdough wild yeast", "expected_evidence": [{"text": "wild yeast"}]},
    )
    create_question(
        space,
        {
            "question": "liquid oxygen kerosene",
            "expected_evidence": [{"document_id": docs["cats.txt"]}],
        },
    )
    baseline = tmp_path / "golden-baseline.json"
    args = ["eval", "--golden", "--space", space.slug, "--tenant", "tenant-a", "--top-k", "1"]
    call_command("kfs", *args, "--json", "--write-baseline", str(baseline))
    run = json.loads(capsys.readouterr().out)
    assert run["hit_rate@1"] == 0.5 and run["results"][1]["missed"] == [
        {"document_id": docs["cats.txt"]}
    ]
    recorded = json.loads(baseline.read_text())
    assert recorded["kind"] == "golden"
    subject = recorded["subject"]
    assert {k: subject[k] for k in ("tenant", "space", "top_k", "tags")} == {
        "tenant": "tenant-a",
        "space": space.slug,
        "top_k": 1,
        "tags": [],
    }
    assert subject["question_set"]["count"] == 2 and len(subject["question_set"]["digest"]) == 64
    engine = next(iter(recorded["engines"]))
    assert recorded["engines"][engine]["fast"] == {
        "hit_rate@1": 0.5,
        "recall@1": 0.5,
        "mrr@1": 0.5,
        "queries": 2,
    }
    call_command("kfs", *args, "--json", "--baseline", str(baseline))
    assert json.loads(capsys.readouterr().out)["gate"]["passed"] is True
    recorded["engines"][engine]["fast"]["hit_rate@1"] = 1.0
    baseline.write_text(json.dumps(recorded))
    with pytest.raises(CommandError) as failed:
        call_command("kfs", *args, "--json", "--baseline", str(baseline))
    assert (
        "fast hit_rate@1 dropped by 0.5000 (baseline 1.0000, measured 0.5000), more than the "
        "allowed 0.0100" in str(failed.value)
    )
    with pytest.raises(CommandError, match="no_golden_questions"):
        call_command("kfs", *args, "--tag", "absent")


def test_admin_screen_validates_with_the_api_rules(admin_client, space):
    add = "/admin/retrieval/goldenquestion/add/"
    assert admin_client.get(add).status_code == 200
    form = {
        "space": str(space.id),
        "question": "Where is the travel policy?",
        "expected_evidence": json.dumps([{"text": "travel policy"}]),
        "tags": json.dumps(["t" * 81]),
        "metadata": "{}",
    }
    refused = admin_client.post(add, form)
    assert refused.status_code == 200
    assert "invalid_tags: tags[0] is 81 characters; the limit is 80" in refused.content.decode()
    assert not space.golden_questions.exists()
    form["tags"] = json.dumps(["policy"])
    created = admin_client.post(add, form)
    assert created.status_code == 302, created.content.decode()[-2000:]
    question = space.golden_questions.get()
    assert (question.tenant_id, question.tags, question.revision) == ("tenant-a", ["policy"], 1)
    change = f"/admin/retrieval/goldenquestion/{question.id}/change/"
    listing = admin_client.get("/admin/retrieval/goldenquestion/")
    assert "Where is the travel policy?" in listing.content.decode()
    form.pop("space")
    form["question"] = "Where is the hotel policy?"
    assert admin_client.post(change, form).status_code == 302
    question.refresh_from_db()
    assert (question.question, question.revision) == ("Where is the hotel policy?", 2)


def test_the_gate_refuses_another_question_set(corpus, tmp_path, capsys):
    """A --tag subset, or a question edited since the baseline, is not the baseline's subject."""
    space, _ = corpus
    yeast = create_question(
        space,
        {"question": "sourdough wild yeast", "expected_evidence": [{"text": "wild yeast"}],
         "tags": ["bread"]},
    )  # fmt: skip
    create_question(space, {"question": "rocket thrust", "expected_evidence": [{"text": "thrust"}]})
    baseline = tmp_path / "golden-baseline.json"
    args = ["eval", "--golden", "--space", space.slug, "--tenant", "tenant-a"]
    call_command("kfs", *args, "--json", "--write-baseline", str(baseline))
    capsys.readouterr()
    call_command("kfs", *args, "--json", "--baseline", str(baseline))  # same set: passes
    assert json.loads(capsys.readouterr().out)["gate"]["passed"] is True
    with pytest.raises(CommandError, match="not comparable"):
        call_command("kfs", *args, "--tag", "bread", "--json", "--baseline", str(baseline))
    update_question(yeast, {"question": "sourdough yeast"}, expected_revision=1)
    with pytest.raises(CommandError, match="not comparable"):
        call_command("kfs", *args, "--json", "--baseline", str(baseline))


def test_kfs_eval_golden_refuses_top_k_0(corpus):
    space, _ = corpus
    create_question(space, {"question": "rocket thrust", "expected_evidence": [{"text": "x"}]})
    args = ["eval", "--golden", "--space", space.slug, "--tenant", "tenant-a", "--json"]
    with pytest.raises(CommandError, match="invalid_top_k"):
        call_command("kfs", *args, "--top-k", "0")


def test_a_patch_moves_updated_at(client, space):
    created = client.post(
        url(space), {"question": "q", "expected_evidence": [{"text": "x"}]}, format="json"
    ).json()
    patched = client.patch(
        url(space, created["id"]), {"tags": ["t", "t"] + ["t"] * 20}, format="json",
        HTTP_IF_MATCH='"1"',
    )  # fmt: skip
    assert patched.status_code == 200, patched.content
    body = patched.json()
    assert body["tags"] == ["t"] and body["revision"] == 2
    assert body["updated_at"] > created["updated_at"]
    assert client.get(url(space, created["id"])).json()["updated_at"] == body["updated_at"]
