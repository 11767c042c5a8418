"""End to end on a real django-q2 cluster (ORM broker): Dify's snapshot through the HTTP route,
the cluster runs every step and compiles the documents, which are published in the new space."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.db import connections
from django_q.brokers import get_broker
from django_q.cluster import Cluster

from ingestion.models import Document
from knowledgefs.testing.upgrade_support import INNER_KEY, inner, legacy_file, snapshot_body

pytestmark = pytest.mark.django_db(transaction=True)

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
def cluster():
    # see tests/system/test_e2e_cluster.py: no inherited sockets in children
    connections.close_all()
    running = Cluster(get_broker())
    running.start()
    yield running
    running.stop()


def test_the_cluster_runs_the_upgrade_and_compiles_its_documents(settings, cluster):
    settings.DIFY_INNER_API_KEY = INNER_KEY
    files = ["api.md", "models.md", "security.md"]
    docs = [legacy_file(name, (DOCS / name).read_bytes(), doc_id=name) for name in files]
    created = inner().post("/internal/dataset-upgrades", snapshot_body(docs), format="json")
    assert created.status_code == 201
    url = f"/internal/dataset-upgrades/{created.json()['id']}?namespace_id=tenant-a"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = inner().get(url).json()
        if job["status"] in ("succeeded", "failed"):
            break
        time.sleep(0.25)
    assert (job["status"], job["stage"], job["completed_documents"]) == (
        "succeeded",
        "completed",
        3,
    )
    while time.monotonic() < deadline:
        published = Document.objects.filter(
            space_id=job["space_id"], active_generation__isnull=False
        )
        if published.count() == 3:
            break
        time.sleep(0.25)
    assert sorted(published.values_list("filename", flat=True)) == sorted(files)
