"""``kfs eval --known-item``: targets drawn from the corpus, each unique to its document, and the
document holding it ranked first (real compiler, embedding model and database)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from retrieval.known_item import build_targets, folder_space

DOCS = {
    "leave.txt": "Every employee receives twenty five days of annual leave each year. Unused leave "
    "days expire at the end of March unless the manager approves a carry over. Requests for "
    "leave go to the manager two weeks ahead of the first day. Policy HR-2041 governs it.",
    "rockets.txt": "Rocket engines burn liquid oxygen and kerosene to produce thrust at launch. "
    "The first stage separates after about two minutes of powered flight. Engine model RX-77B "
    "was tested in the desert during the spring campaign of the program.",
    "bread.txt": "Sourdough bread rises slowly because wild yeast ferments the dough overnight. "
    "Bakers keep a starter alive by feeding it flour and water every single day. Recipe "
    "card B-19 lists rye flour, salt and water in that order.",
}


@pytest.fixture
def folder(tmp_path):
    for name, text in DOCS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "README.md").write_text("not part of the benchmark")
    return tmp_path


@pytest.mark.django_db
def test_targets_are_unique_to_their_document_and_identifiers_are_drawn(folder):
    space = folder_space(folder)
    assert sorted(space.documents.values_list("filename", flat=True)) == sorted(DOCS)
    targets = build_targets(space, sample=12, seed=3)
    assert len(targets) >= 6
    names = dict(space.documents.values_list("id", "filename"))
    for target in targets:
        source = DOCS[names[target["document_id"]]]
        assert target["query"] in source
        others = [t for n, t in DOCS.items() if n != names[target["document_id"]]]
        assert all(target["query"].casefold() not in o.casefold() for o in others)
    assert {t["kind"] for t in targets} == {"sentence", "identifier"}
    assert folder_space(folder).id == space.id  # reused while the files are unchanged


@pytest.mark.django_db
@pytest.mark.parametrize("fusion", ["minmax", "calibrated"])
def test_kfs_eval_known_item_ranks_the_source_document_first(folder, settings, fusion):
    """Targets are drawn in filename order, so the run is the same on every engine. Min-max
    fusion gives the lone exact hit of the identifier ``B-19`` and the best semantic neighbour
    the same fused score and ranks it second (the weakness the calibrated fusion's exact-match
    boost answers); every other target is first."""
    settings.KNOWLEDGE_LOCAL_RERANK_ENABLED = False
    out = StringIO()
    call_command(
        "kfs", "eval", str(folder), "--known-item", "--mode", "fast", "--fusion", fusion,
        "--json", stdout=out,
    )  # fmt: skip
    run = json.loads(out.getvalue())
    assert run["kind"] == "known-item" and run["fusion"] == fusion
    assert run["targets"] >= 6 and run["documents"] == 3
    if fusion == "calibrated":
        assert run["success@1"] == 1.0 and run["misses"] == [], run
    else:
        assert [m["query"] for m in run["misses"]] in ([], ["B-19"]), run
        assert run["success@1"] >= (run["targets"] - 1) / run["targets"] - 1e-4, run
