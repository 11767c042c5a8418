"""The retrieval regression gate: its comparison rules, and ``kfs eval`` on the committed
eval-mini fixture against the committed baseline (what ``make eval-gate`` runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from knowledgefs.errors import InvalidInput
from retrieval.evaluation import build_baseline, check_gate, engine, load_baseline

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "eval-mini"
BASELINE = FIXTURE / "baseline.json"


def run(mode="fast", ndcg=0.7, recall=0.9, mrr=0.6, **subject) -> dict:
    return {
        "kind": "beir",
        "dataset": "eval-mini",
        "split": "test",
        "top_k": 100,
        "legs": "dense+keyword",
        "fusion": "minmax",
        "mode": mode,
        "ndcg@10": ndcg,
        "recall@100": recall,
        "mrr@10": mrr,
        "queries": 30,
        "embedding_model": "local/m",
        **subject,
    }


@pytest.mark.django_db
def test_equal_passes_and_a_higher_baseline_fails_naming_metric_values_and_drop():
    baseline = build_baseline([run()])
    assert baseline["engines"][engine()]["fast"] == {
        "ndcg@10": 0.7,
        "recall@100": 0.9,
        "mrr@10": 0.6,
        "queries": 30,
    }
    equal = check_gate([run()], baseline, 0.01)
    assert equal["passed"] is True and len(equal["checks"]) == 3 and equal["failures"] == []
    within = check_gate([run(ndcg=0.69)], baseline, 0.01)
    assert within["passed"] is True
    higher = build_baseline([run(ndcg=0.75, mrr=0.6101)])
    failed = check_gate([run()], higher, 0.01)
    assert failed["passed"] is False
    assert failed["failures"] == [
        "fast ndcg@10 dropped by 0.0500 (baseline 0.7500, measured 0.7000), more than the "
        "allowed 0.0100",
        "fast mrr@10 dropped by 0.0101 (baseline 0.6101, measured 0.6000), more than the "
        "allowed 0.0100",
    ]
    improved = check_gate([run(ndcg=0.9)], baseline, 0.0)
    assert improved["passed"] is True
    assert [c["drop"] for c in improved["checks"]] == [-0.2, 0.0, 0.0]


@pytest.mark.django_db
def test_modes_missing_from_the_baseline_are_noted_and_other_subjects_fail():
    baseline = build_baseline([run()])
    result = check_gate([run(), run("deep")], baseline, 0.01)
    assert result["passed"] is True
    assert result["notes"] == [
        f"deep: the baseline holds no {engine()} numbers for it, not gated "
        "(record them with --write-baseline)"
    ]
    other = check_gate([run(top_k=10)], baseline, 0.01)
    assert other["passed"] is False and "not comparable" in other["failures"][0]
    model = check_gate([run(embedding_model="local/other")], baseline, 0.01)
    assert model["passed"] is True
    assert model["notes"] == ["the baseline was recorded with local/m, this run uses local/other"]
    with pytest.raises(InvalidInput) as bad:
        check_gate([run()], baseline, 1.5)
    assert bad.value.code == "invalid_max_drop"
    extended = build_baseline([run("deep", ndcg=0.8)], previous=baseline)
    assert sorted(extended["engines"][engine()]) == ["deep", "fast"]


def test_bad_baseline_files_are_refused(tmp_path):
    for content, message in (
        ("{", "is not JSON"),
        ('{"format": "other"}', "is not a kfs-eval-baseline/1 document"),
        (
            '{"format": "kfs-eval-baseline/1", "engines": {"sqlite": {"fast": {"ndcg@10": "x"}}}}',
            "'engines' must map each engine to modes to numeric metrics",
        ),
    ):
        path = tmp_path / "b.json"
        path.write_text(content)
        with pytest.raises(InvalidInput) as refused:
            load_baseline(path)
        assert refused.value.code == "invalid_baseline" and message in refused.value.message
    with pytest.raises(InvalidInput, match="does not exist"):
        load_baseline(tmp_path / "absent.json")


def test_committed_baseline_holds_fast_for_both_engines():
    baseline = load_baseline(BASELINE)
    assert baseline["subject"] == {
        "dataset": "eval-mini",
        "split": "test",
        "top_k": 100,
        "legs": "dense+keyword",
        "fusion": "calibrated",  # the default fusion
    }
    for name in ("sqlite", "postgresql"):
        assert baseline["engines"][name]["fast"]["queries"] == 30
        assert baseline["engines"][name]["fast"]["ndcg@10"] > 0.69


@pytest.mark.django_db
def test_kfs_eval_refuses_a_gate_it_would_not_run(tmp_path, capsys):
    # --max-drop without --baseline used to be ignored (exit 0, no gate); --mode auto with a
    # baseline "passed (0 checks)". Both are refused before anything is evaluated.
    args = ["eval", str(FIXTURE), "--json"]
    with pytest.raises(CommandError, match=r"--max-drop .* give --baseline"):
        call_command("kfs", *args, "--mode", "fast", "--max-drop", "0.01")
    with pytest.raises(CommandError, match="--mode auto cannot be gated"):
        call_command("kfs", *args, "--mode", "auto", "--baseline", str(BASELINE))
    with pytest.raises(CommandError, match="--mode auto cannot be gated"):
        call_command("kfs", *args, "--mode", "fast,auto", "--baseline", str(BASELINE))
    assert capsys.readouterr().out == ""


@pytest.mark.django_db
def test_kfs_eval_on_the_committed_fixture_passes_the_gate_and_round_trips(tmp_path, capsys):
    """One compile of the fixture (about 30 s), then reused by the later runs."""
    args = ["eval", str(FIXTURE), "--json"]
    gate = ["--max-drop", "0.01"]
    call_command("kfs", *args, *gate, "--mode", "fast", "--baseline", str(BASELINE))
    measured = json.loads(capsys.readouterr().out)
    assert measured["mode"] == "fast" and measured["resolved_mode"] == "fast"
    assert measured["queries"] == 30 and measured["documents"] == 200
    assert measured["gate"]["passed"] is True, measured["gate"]
    assert [c["metric"] for c in measured["gate"]["checks"]] == ["ndcg@10", "recall@100", "mrr@10"]

    written = tmp_path / "baseline.json"
    call_command("kfs", *args, "--mode", "fast", "--write-baseline", str(written))
    again = json.loads(capsys.readouterr().out)
    assert again["reused_space"] is True and again["ndcg@10"] == measured["ndcg@10"]
    recorded = load_baseline(written)["engines"][engine()]["fast"]
    assert recorded == {m: measured[m] for m in ("ndcg@10", "recall@100", "mrr@10")} | {
        "queries": 30
    }

    bumped = json.loads(written.read_text())
    bumped["engines"][engine()]["fast"]["ndcg@10"] = round(measured["ndcg@10"] + 0.05, 4)
    written.write_text(json.dumps(bumped))
    with pytest.raises(CommandError) as failed:
        call_command("kfs", *args, *gate, "--mode", "fast", "--baseline", str(written))
    assert (
        f"fast ndcg@10 dropped by 0.0500 (baseline {measured['ndcg@10'] + 0.05:.4f}, "
        f"measured {measured['ndcg@10']:.4f}), more than the allowed 0.0100"
    ) in str(failed.value)
    capsys.readouterr()

    call_command("kfs", *args, "--mode", "fast", "--top-k", "10")
    top10 = json.loads(capsys.readouterr().out)
    # 10 items per query: Recall@100 counts only those; each leg fetches 50, not 100 candidates
    assert top10["top_k"] == 10 and top10["recall@100"] <= measured["recall@100"]

    with pytest.raises(CommandError, match="invalid_mode: mode must be one of"):
        call_command("kfs", *args, "--mode", "fastest")
    with pytest.raises(CommandError, match="invalid_top_k"):
        call_command("kfs", *args, "--top-k", "101")
