"""The layers of docs/architecture.md: the import graph has no circle, every module is a floor
or the roof, the committed picture is the one the code draws (scripts/import_graph.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _graph_module():
    spec = importlib.util.spec_from_file_location(
        "import_graph", ROOT / "scripts" / "import_graph.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_circles_finds_every_strongly_connected_component_of_two_or_more():
    graph = _graph_module()
    edges = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": set(),
        "e": {"f"},
        "f": {"e"},
        "g": {"g"},  # a module importing itself is no circle of modules
    }
    assert sorted(graph.circles(edges)) == [["a", "b", "c"], ["e", "f"]]


def test_a_module_is_a_floor_only_when_a_contract_names_it_or_a_package_above_it():
    graph = _graph_module()
    floors = ["spaces.models", "ingestion.compilation"]
    assert graph.classify("ingestion.compilation.leases", floors) == "floor"
    assert graph.classify("ingestion.compilationx", floors) == "unclassified"
    assert graph.classify("spaces.api.views", floors) == "roof"
    assert graph.classify("spaces", floors) == "package"


def test_the_project_has_no_import_circle_and_no_unclassified_module():
    graph = _graph_module()
    edges, _ = graph.build()
    assert graph.problems(edges) == []


def test_the_committed_layers_picture_is_the_one_the_code_draws():
    graph = _graph_module()
    edges, _ = graph.build()
    committed = (ROOT / "docs" / "layers.svg").read_text(encoding="utf-8")
    assert graph.svg(edges) == committed, "docs/layers.svg is stale: run `make docs`"
