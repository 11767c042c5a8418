"""Document availability and row versions: a disabled document is never returned by a Fast query,
on either leg, on SQLite (FTS5) and PostgreSQL (tsvector); writes are compare-and-set."""

from __future__ import annotations

import pytest

from ingestion.availability import (
    StaleRowVersion,
    patch_document_metadata,
    set_document_availability,
)
from ingestion.documents import admit_document
from ingestion.models import Document
from knowledgefs.errors import InvalidInput, NotFound
from knowledgefs.testing.fixtures import compile_all
from retrieval.modes import retrieve

pytestmark = pytest.mark.django_db

TEXTS = {
    "lagoon.txt": "The hidden lagoon shelters green turtles during the monsoon season.",
    "harbour.txt": "The harbour crane lifts shipping containers onto cargo vessels.",
}


@pytest.fixture
def corpus(space):
    docs = {
        name: admit_document(space, filename=name, data=text.encode(), enqueue=False).document
        for name, text in TEXTS.items()
    }
    compile_all()
    return space, docs


def _files(result) -> list[str]:
    return [item.citation["filename"] for item in result.items]


@pytest.mark.parametrize("legs", [("keyword",), ("dense",), ("dense", "keyword")])
def test_a_disabled_document_is_never_returned(corpus, legs):
    space, docs = corpus
    query = "hidden lagoon turtles monsoon"
    assert "lagoon.txt" in _files(retrieve(space, query, top_k=5, legs=legs))  # warms the cache
    assert set_document_availability(docs["lagoon.txt"].id, False, 1) == 2
    result = retrieve(space, query, top_k=5, legs=legs)
    assert "lagoon.txt" not in _files(result)
    assert all("lagoon" not in item.text for item in result.items)
    assert set_document_availability(docs["lagoon.txt"].id, True, 2) == 3
    assert _files(retrieve(space, query, top_k=5, legs=legs))[0] == "lagoon.txt"


def test_availability_is_a_compare_and_set(corpus):
    _, docs = corpus
    doc = docs["harbour.txt"]
    assert set_document_availability(doc.id, True, 1) == 1  # no change: the version stays
    assert set_document_availability(doc.id, False, 1) == 2
    with pytest.raises(StaleRowVersion) as stale:
        set_document_availability(doc.id, True, 1)
    assert stale.value.status == 409
    assert stale.value.message == "the document is at row_version 2, not 1; read it again"
    doc.refresh_from_db()
    assert (doc.enabled, doc.row_version) == (False, 2)


def test_metadata_patches_merge_and_null_removes(corpus):
    _, docs = corpus
    doc = docs["harbour.txt"]
    assert patch_document_metadata(doc.id, {"port": "Ayr", "berth": 4}, 1) == 2
    assert patch_document_metadata(doc.id, {"berth": None, "crane": "C2"}, 2) == 3
    doc.refresh_from_db()
    assert doc.metadata == {"port": "Ayr", "crane": "C2"}


@pytest.mark.parametrize(
    "patch,version,code",
    [
        ([1, 2], 1, "invalid_metadata"),
        ({"": 1}, 1, "invalid_metadata"),
        ({"k" * 256: 1}, 1, "invalid_metadata"),
        ({"k": float("nan")}, 1, "invalid_metadata"),
        ({"k": "x" * 70_000}, 1, "invalid_metadata"),
        ({"k": 1}, 0, "invalid_row_version"),
        ({"k": 1}, True, "invalid_row_version"),
    ],
)
def test_bad_patches_are_refused_with_a_code(corpus, patch, version, code):
    _, docs = corpus
    with pytest.raises(InvalidInput) as refused:
        patch_document_metadata(docs["harbour.txt"].id, patch, version)
    assert refused.value.code == code
    assert Document.objects.get(id=docs["harbour.txt"].id).row_version == 1


def test_an_unknown_document_is_404(db):
    import uuid

    with pytest.raises(NotFound) as missing:
        set_document_availability(uuid.uuid4(), False, 1)
    assert missing.value.code == "document_not_found"


def test_patch_route_applies_metadata_and_availability_with_if_match(client, space):
    from knowledgefs.testing.fixtures import upload

    created = upload(client, space, "lagoon.txt", TEXTS["lagoon.txt"].encode()).json()
    url = f"/v1/knowledge-spaces/{space.id}/documents/{created['document']['id']}"
    read = client.get(url)
    assert (read.json()["enabled"], read.json()["row_version"], read["ETag"]) == (True, 1, '"1"')
    changed = client.patch(
        url,
        {"enabled": False, "metadata": {"owner": "ops"}},
        format="json",
        HTTP_IF_MATCH='"1"',
    )
    assert changed.status_code == 200, changed.content
    body = changed.json()
    assert (body["enabled"], body["metadata"], body["row_version"]) == (False, {"owner": "ops"}, 3)
    assert changed["ETag"] == '"3"'
    stale = client.patch(url, {"enabled": True}, format="json", HTTP_IF_MATCH='"1"')
    assert stale.status_code == 409
    assert stale.json() == {
        "code": "document_version_conflict",
        "message": "the document is at row_version 3, not 1; read it again",
        "details": {"expected": 1, "current": 3},
    }
    by_body = client.patch(url, {"enabled": True, "row_version": 3}, format="json")
    assert (by_body.status_code, by_body.json()["enabled"]) == (200, True)
    missing = client.patch(url, {"enabled": False}, format="json")
    assert (missing.status_code, missing.json()["code"]) == (400, "invalid_row_version")
    nothing = client.patch(url, {"row_version": 4}, format="json")
    assert (nothing.status_code, nothing.json()["code"]) == (400, "invalid_request")
    bad = client.patch(url, {"enabled": "no", "row_version": 4}, format="json")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_availability")


def test_the_text_of_a_disabled_document_is_refused_but_its_metadata_is_shown(client, space):
    from knowledgefs.testing.fixtures import upload

    created = upload(client, space, "lagoon.txt", TEXTS["lagoon.txt"].encode()).json()
    doc = created["document"]["id"]
    compile_all()
    base = f"/v1/knowledge-spaces/{space.id}/documents"
    text_url = f"{base}/{doc}/text"
    served = client.get(text_url)
    assert served.status_code == 200
    assert served.json()["text"].startswith(TEXTS["lagoon.txt"][:20])
    off = client.patch(f"{base}/{doc}", {"enabled": False, "row_version": 1}, format="json")
    assert off.status_code == 200, off.content
    refused = client.get(text_url)
    assert refused.status_code == 409
    assert refused.json()["code"] == "document_disabled"
    assert "enable it first" in refused.json()["message"]
    assert TEXTS["lagoon.txt"][:20] not in refused.content.decode()
    detail = client.get(f"{base}/{doc}")
    assert (detail.status_code, detail.json()["enabled"]) == (200, False)
    listed = {d["id"]: d["enabled"] for d in client.get(base).json()["results"]}
    assert listed[doc] is False
    on = client.patch(f"{base}/{doc}", {"enabled": True, "row_version": 2}, format="json")
    assert on.status_code == 200, on.content
    assert client.get(text_url).status_code == 200
