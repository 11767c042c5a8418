"""Two real processes publishing into one space at once never corrupt its keyword index: every
node is searchable afterwards from a third process and the index opens cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SETUP = """
import django; django.setup()
from knowledgefs.auth.principal import Principal
from spaces.services import create_space
create_space(Principal(tenant_id="kw"), name="Concurrent", slug="concurrent")
"""

WRITER = """
import sys, django; django.setup()
from ingestion.compilation.recovery import drain_queued
from ingestion.documents import admit_document
from spaces.models import KnowledgeSpace
space = KnowledgeSpace.objects.get(slug="concurrent")
who = sys.argv[1]
ids = [
    admit_document(
        space, filename=f"{who}-{i}.txt", enqueue=False,
        data=f"Report {who} number {i}: marker{who}x{i} appears once here.".encode(),
    ).document.id
    for i in range(12)
]
for start in range(0, len(ids), 3):  # several publications, each with its own index commit
    drain_queued(space.id, document_ids=ids[start:start + 3])
print("done", who)
"""

VERIFY = """
import django; django.setup()
from ingestion.models import Document, KnowledgeNode
from retrieval.backends import get_search_backend
from retrieval.keyword_index import maintenance
from spaces.models import KnowledgeSpace
space = KnowledgeSpace.objects.get(slug="concurrent")
backend = get_search_backend()
assert maintenance.problem(space.id) is None
assert Document.objects.filter(space=space, state="published").count() == 24
nodes = KnowledgeNode.objects.filter(space=space).count()
assert backend.projection_counts(space.id)["keyword"] == nodes, nodes
for who in "ab":
    for i in range(12):
        hits = backend.keyword_search(space.id, f"marker{who}x{i}", 5)
        assert len(hits) == 1, (who, i, hits)
print("ok", nodes)
"""


@pytest.mark.skipif(os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="SQLite")
def test_two_processes_publishing_into_one_space(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "knowledgefs.settings",
        "KNOWLEDGE_VAR_DIR": str(tmp_path / "var"),
        "KNOWLEDGE_OBJECT_STORAGE_DIR": str(tmp_path / "objects"),
    }
    env.pop("DATABASE_URL", None)

    def run(*args, timeout=300):
        result = subprocess.run(
            [sys.executable, *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    run("manage.py", "migrate", "--noinput")
    run("-c", SETUP)
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, who],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for who in "ab"
    ]
    for w in writers:
        out, err = w.communicate(timeout=600)
        assert w.returncode == 0, err[-3000:]
    assert "ok 24" in run("-c", VERIFY)
