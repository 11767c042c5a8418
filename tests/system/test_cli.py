"""The kfs command line, through call_command: the same services as the API."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def kfs(*args: str) -> str:
    out = StringIO()
    call_command("kfs", *args, stdout=out)
    return out.getvalue()


def test_space_key_ingest_query_and_documents(tmp_path):
    space = json.loads(kfs("space", "create", "Handbook", "--tenant", "acme", "--json"))
    assert space["slug"] == "handbook" and space["id"]
    assert "using existing" in kfs(
        "space", "create", "Handbook", "--tenant", "acme", "--slug", "handbook", "--exists-ok"
    )
    key = json.loads(kfs("apikey", "create", "--tenant", "acme", "--space", "handbook", "--json"))
    assert key["key"].startswith("kfs_") and key["spaces"] == ["handbook"]

    folder = tmp_path / "docs"
    (folder / "nested").mkdir(parents=True)
    (folder / "leave.md").write_text("# Leave\n\nStaff get 28 days of paid annual leave.\n")
    (folder / "nested" / "expenses.txt").write_text("Expense reports are due within 30 days.")
    (folder / ".hidden").write_text("ignored")
    report = json.loads(
        kfs("ingest", str(folder), "--space", "handbook", "--tenant", "acme", "--wait", "--json")
    )
    assert sorted(d["state"] for d in report["admitted"]) == ["published", "published"]

    again = json.loads(
        kfs("ingest", str(folder), "--space", "handbook", "--tenant", "acme", "--wait", "--json")
    )
    assert len(again["skipped"]) == 2 and again["admitted"] == []

    result = json.loads(
        kfs(
            "query",
            "how many days of annual leave?",
            "--space",
            "handbook",
            "--tenant",
            "acme",
            "--top-k",
            "1",
            "--json",
        )
    )
    assert result["mode"] == "fast"
    assert result["items"][0]["citation"]["filename"] == "leave.md"
    assert result["items"][0]["citation"]["section_path"] == ["Leave"]

    listing = json.loads(kfs("documents", "--space", "handbook", "--tenant", "acme", "--json"))
    assert {d["filename"]: d["nodes"] for d in listing["items"]} == {
        "leave.md": 1,
        "expenses.txt": 1,
    }
    assert all(d["error_code"] is None for d in listing["items"])

    kfs("apikey", "revoke", key["prefix"])


def test_ingest_wait_exits_non_zero_when_a_document_fails(tmp_path):
    kfs("space", "create", "S", "--tenant", "acme")
    (tmp_path / "blank.txt").write_text("   \n\n ")
    with pytest.raises(CommandError, match="1 documents failed"):
        kfs("ingest", str(tmp_path), "--space", "s", "--tenant", "acme", "--wait")


def test_errors_are_reported_with_their_code():
    with pytest.raises(CommandError, match="space_not_found"):
        kfs("query", "x", "--space", "nope", "--tenant", "acme")
    with pytest.raises(CommandError, match="invalid_tenant"):
        kfs("space", "create", "S", "--tenant", "bad tenant!")


def test_space_set_model_builds_and_cuts_over_with_wait(tmp_path, settings):
    from knowledgefs.testing.embedders import FAKE_MODELS, MODEL_B
    from retrieval.models import DenseVector

    settings.KNOWLEDGE_EMBEDDING_MODELS = FAKE_MODELS
    call_command("kfs", "space", "create", "Models", "--tenant", "t1", "--slug", "models")
    (tmp_path / "a.md").write_text("# Tides\n\nThe moon pulls the oceans.\n")
    call_command("kfs", "ingest", str(tmp_path), "--space", "models", "--tenant", "t1", "--wait")
    out = StringIO()
    call_command(
        "kfs",
        "space",
        "set-model",
        "models",
        MODEL_B,
        "--tenant",
        "t1",
        "--wait",
        "--json",
        stdout=out,
    )
    summary = json.loads(out.getvalue())
    assert summary["active"]["model_id"] == MODEL_B and summary["building"] is None
    assert set(DenseVector.objects.values_list("dimension", flat=True)) == {4}
    with pytest.raises(CommandError, match="unknown_embedding_model"):
        call_command("kfs", "space", "set-model", "models", "nope/x", "--tenant", "t1")


def test_query_threshold_takes_a_number_or_off():
    from knowledgefs.management.commands.kfs import Command
    from retrieval.modes import PROFILE

    parser = Command().create_parser("manage.py", "kfs")
    base = ["query", "x", "--space", "s", "--tenant", "t"]
    assert parser.parse_args(base).threshold is PROFILE  # left out: the profile's threshold
    assert parser.parse_args([*base, "--threshold", "off"]).threshold is None
    assert parser.parse_args([*base, "--threshold", "null"]).threshold is None
    assert parser.parse_args([*base, "--threshold", "0.4"]).threshold == 0.4
    answer = ["answer", "x", "--space", "s", "--tenant", "t"]
    assert parser.parse_args([*answer, "--threshold", "OFF"]).threshold is None
    assert parser.parse_args([*answer, "--filters", "{}"]).filters == "{}"
    with pytest.raises(CommandError, match="invalid threshold 'high'"):
        parser.parse_args([*base, "--threshold", "high"])


def test_make_demo_prints_cited_answers_and_fails_when_ingest_fails():
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    recipe = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "|| echo" not in recipe and "|| true" not in recipe
    assert recipe.count(" kfs answer ") == 2 and " kfs query " not in recipe
