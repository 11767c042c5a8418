"""Keyset pagination on every list route (knowledgefs/pagination.py, docs/api.md "Pagination"):
rows created between page reads, ties on ``created_at``, signed and listing-bound cursors,
limit bounds."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import signing
from rest_framework.test import APIClient

from knowledgefs.pagination import NewestFirstPagination
from knowledgefs.testing.fixtures import upload
from spaces.api_keys import create_api_key
from spaces.models import KnowledgeSpace
from spaces.services import Principal, create_space

pytestmark = pytest.mark.django_db

SPACES = "/v1/knowledge-spaces"
MOMENT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def cursor_of(link: str) -> str:
    return parse_qs(urlsplit(link).query)["cursor"][0]


def walk(client, url: str) -> list[str]:
    """Every id of a listing, following ``next`` links."""
    seen, page = [], client.get(url).json()
    seen += [row["id"] for row in page["results"]]
    while page["next"]:
        page = client.get(page["next"]).json()
        seen += [row["id"] for row in page["results"]]
    return seen


def spaces_at_one_moment(principal, count: int) -> list[str]:
    """``count`` spaces sharing one ``created_at``; their ids in the listing's order."""
    ids = [create_space(principal, name=f"S{n}").id for n in range(count)]
    KnowledgeSpace.objects.filter(id__in=ids).update(created_at=MOMENT)
    return [str(i) for i in sorted(ids, reverse=True)]


def test_a_space_created_between_page_reads_is_not_returned_twice_nor_any_skipped(
    client, principal
):
    ordered = spaces_at_one_moment(principal, 4)
    first = client.get(SPACES, {"limit": 2}).json()
    assert [s["id"] for s in first["results"]] == ordered[:2]
    # A new space at the same moment sorting before the page boundary (an offset cursor
    # returned the boundary row again and skipped the last one).
    # (Spaces created now sort before the first page too, so the misses do not matter.)
    boundary = uuid.UUID(ordered[1])
    newcomer = create_space(principal, name="late")
    while newcomer.id < boundary:
        newcomer = create_space(principal, name=f"late {newcomer.id}")
    KnowledgeSpace.objects.filter(id=newcomer.id).update(created_at=MOMENT)
    rest = client.get(first["next"]).json()
    assert [s["id"] for s in rest["results"]] == ordered[2:]
    assert rest["next"] is None


def test_a_newer_row_created_between_reads_does_not_shift_the_next_page(client, space):
    for n in range(3):
        create_space(Principal(tenant_id="tenant-a"), name=f"later {n}")
    before = walk(client, f"{SPACES}?limit=1")
    first = client.get(SPACES, {"limit": 2}).json()
    create_space(Principal(tenant_id="tenant-a"), name="newest")
    rest = walk(client, first["next"])
    assert [s["id"] for s in first["results"]] + rest == before


def test_ties_on_created_at_are_ordered_by_id_and_limit_1_walks_all(client, principal):
    ordered = spaces_at_one_moment(principal, 5)
    assert walk(client, f"{SPACES}?limit=1") == ordered
    assert walk(client, f"{SPACES}?limit=3") == ordered
    assert [s["id"] for s in client.get(SPACES).json()["results"]] == ordered


def test_previous_links_walk_back_to_the_first_page(client, principal):
    ordered = spaces_at_one_moment(principal, 5)
    first = client.get(SPACES, {"limit": 2}).json()
    assert first["previous"] is None
    second = client.get(first["next"]).json()
    third = client.get(second["next"]).json()
    assert [s["id"] for s in third["results"]] == ordered[4:] and third["next"] is None
    back = client.get(third["previous"]).json()
    assert [s["id"] for s in back["results"]] == ordered[2:4]
    start = client.get(back["previous"]).json()
    assert [s["id"] for s in start["results"]] == ordered[:2] and start["previous"] is None


@pytest.mark.parametrize("limit", ["1", "100"])
def test_limit_bounds_are_accepted(client, space, limit):
    assert client.get(SPACES, {"limit": limit}).status_code == 200


@pytest.mark.parametrize("limit", ["0", "101", "-1", "1e2", ""])
def test_limit_outside_the_bounds_is_400(client, space, limit):
    refused = client.get(SPACES, {"limit": limit})
    assert (refused.status_code, refused.json()["code"]) == (400, "invalid_limit")
    assert "1 to 100" in refused.json()["message"]


def test_a_changed_or_forged_cursor_is_400(client, principal):
    spaces_at_one_moment(principal, 3)
    issued = cursor_of(client.get(SPACES, {"limit": 1}).json()["next"])
    assert client.get(SPACES, {"limit": 1, "cursor": issued}).status_code == 200
    payload, _, signature = issued.rpartition(":")
    changed = [
        issued[:-1] + ("A" if issued[-1] != "A" else "B"),  # the signature
        "x" + issued,  # the payload
        f"{payload}:",
        base64.b64encode(b"p=2026-01-01T00:00:00Z&o=1").decode(),  # an offset cursor
        signing.dumps({"k": [MOMENT.isoformat(), str(uuid.uuid4())], "b": 0}),  # other salt
        signing.dumps({"k": [MOMENT.isoformat(), str(uuid.uuid4())], "b": 0}, key="other"),
        "%00",
    ]
    for cursor in changed:
        refused = client.get(SPACES, {"cursor": cursor})
        assert (refused.status_code, refused.json()["code"]) == (400, "invalid_cursor"), cursor
        assert "cursor" in refused.json()["message"]


def test_a_cursor_from_another_listing_space_filter_or_tenant_is_400(client, principal, tenant):
    a, b = create_space(principal, name="A"), create_space(principal, name="B")
    for n in range(2):
        assert upload(client, a, f"a{n}.txt", f"alpha {n}".encode()).status_code == 202
        assert upload(client, b, f"b{n}.txt", f"beta {n}".encode()).status_code == 202
    docs_a = f"{SPACES}/{a.id}/documents"
    from_docs_a = cursor_of(client.get(docs_a, {"limit": 1}).json()["next"])
    assert client.get(docs_a, {"cursor": from_docs_a}).status_code == 200
    from_jobs = cursor_of(
        client.get(f"{SPACES}/{a.id}/jobs", {"limit": 1, "state": "queued"}).json()["next"]
    )
    from_spaces = cursor_of(client.get(SPACES, {"limit": 1}).json()["next"])
    foreign = [
        (f"{SPACES}/{b.id}/documents", from_docs_a),  # another space
        (f"{SPACES}/{a.id}/jobs", from_docs_a),  # another listing
        (f"{SPACES}/{a.id}/golden-questions", from_docs_a),
        (f"{SPACES}/{a.id}/research-tasks", from_docs_a),
        (SPACES, from_docs_a),
        (docs_a, from_spaces),
        (f"{SPACES}/{a.id}/jobs?state=failed", from_jobs),  # another filter
        (f"{SPACES}/{a.id}/jobs", from_jobs),  # the filter dropped
    ]
    for url, cursor in foreign:
        refused = client.get(f"{url}{'&' if '?' in url else '?'}cursor={cursor}")
        assert (refused.status_code, refused.json()["code"]) == (400, "invalid_cursor"), url
    same_filter = client.get(f"{SPACES}/{a.id}/jobs", {"state": "queued", "cursor": from_jobs})
    assert same_filter.status_code == 200
    # Another tenant's cursor of the same (tenant-wide) listing.
    other = create_space(Principal(tenant_id="tenant-z"), name="Z")
    create_space(Principal(tenant_id="tenant-z"), name="Z2")
    z = APIClient(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-z')[1]}")
    from_z = cursor_of(z.get(SPACES, {"limit": 1}).json()["next"])
    assert z.get(SPACES, {"cursor": from_z}).status_code == 200
    refused = client.get(SPACES, {"cursor": from_z})
    assert (refused.status_code, refused.json()["code"]) == (400, "invalid_cursor")
    assert str(other.id) not in refused.content.decode()


def test_documents_and_jobs_pages_hold_every_row_once(client, space):
    for n in range(5):
        assert upload(client, space, f"d{n}.txt", f"text {n}".encode()).status_code == 202
    documents = walk(client, f"{SPACES}/{space.id}/documents?limit=2")
    jobs = walk(client, f"{SPACES}/{space.id}/jobs?limit=2")
    assert len(documents) == len(set(documents)) == 5
    assert len(jobs) == len(set(jobs)) == 5


def test_every_list_view_uses_the_signed_keyset_paginator():
    """Every paginated list route orders by a unique key (the id breaks created_at ties)."""
    from retrieval.api.research_tasks import SequencePagination

    assert NewestFirstPagination.ordering == ("-created_at", "-id")
    assert SequencePagination.ordering == ("sequence", "id")


def test_the_internal_upgrade_list_pages_with_a_bound_cursor(settings):
    from knowledgefs.testing.upgrade_support import INNER_KEY, inner, snapshot_body

    settings.DIFY_INNER_API_KEY = INNER_KEY
    for n in range(3):
        body = snapshot_body([], dataset_id=f"ds-{n}", idempotency_key=f"k-{n}")
        assert inner().post("/internal/dataset-upgrades", body, format="json").status_code == 201
    url = "/internal/dataset-upgrades?namespace_id=tenant-a"
    first = inner().get(f"{url}&limit=2").json()
    assert len(first["results"]) == 2 and first["next"] and first["previous"] is None
    rest = inner().get(first["next"]).json()
    assert len(rest["results"]) == 1 and rest["next"] is None
    ids = [j["id"] for j in first["results"] + rest["results"]]
    assert len(set(ids)) == 3
    everything = inner().get(url).json()  # the default page holds up to 100
    assert [j["id"] for j in everything["results"]] == ids and everything["next"] is None
    cursor = cursor_of(first["next"])
    foreign = inner().get(f"/internal/dataset-upgrades?namespace_id=tenant-b&cursor={cursor}")
    assert (foreign.status_code, foreign.json()["code"]) == (400, "invalid_cursor")
