"""End to end: upload through the API, a real django-q2 cluster (ORM broker) compiles, query."""

from __future__ import annotations

import time

import pytest
from django.db import connections
from django_q.brokers import get_broker
from django_q.cluster import Cluster

from knowledgefs.testing.fixtures import upload

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cluster():
    # The cluster forks its workers from this process. Close our database connections first so
    # that no child inherits (and later closes) a socket the test itself is using: on
    # PostgreSQL a child closing an inherited connection ends it for the parent too.
    connections.close_all()
    broker = get_broker()
    running = Cluster(broker)
    running.start()
    yield running
    running.stop()


def _wait_for(client, job_id: str, seconds: float = 90) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["run_state"] in {"succeeded", "failed", "canceled"}:
            return job
        time.sleep(0.25)
    raise AssertionError(f"job {job_id} did not finish in {seconds}s: {job}")


def test_upload_compile_on_the_cluster_and_query(client, cluster):
    space = client.post("/v1/knowledge-spaces", {"name": "E2E"}, format="json").json()

    class S:  # the upload helper only needs the id
        id = space["id"]

    docs = {
        "volcano.md": b"# Volcanoes\n\nMagma chambers feed eruptions through volcanic vents.\n",
        "tides.txt": b"Ocean tides follow the gravitational pull of the moon and the sun.",
    }
    jobs = [upload(client, S, name, data).json()["job"]["id"] for name, data in docs.items()]
    for job_id in jobs:
        job = _wait_for(client, job_id)
        assert (job["stage"], job["run_state"]) == ("published", "succeeded"), job
    response = client.post(
        f"/v1/knowledge-spaces/{space['id']}/retrieval-tests",
        {"query": "what pulls the tides?", "top_k": 2},
        format="json",
    )
    assert response.status_code == 200
    top = response.json()["items"][0]
    assert top["citation"]["filename"] == "tides.txt"
    assert "moon" in top["text"]
    assert top["citation"]["start_offset"] == 0
