"""Evaluation metrics and the BEIR evaluation run on a small generated dataset."""

from __future__ import annotations

import json
import math

import pytest

from retrieval.evaluation import evaluate, mrr_at_k, ndcg_at_k, recall_at_k


def test_metrics_match_hand_computed_values():
    relevant = {"d1": 1, "d3": 1}
    ranked = ["d2", "d1", "d4", "d3"]
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    idcg = 1 + 1 / math.log2(3)
    assert ndcg_at_k(ranked, relevant, 10) == pytest.approx(dcg / idcg)
    assert recall_at_k(ranked, relevant, 2) == 0.5
    assert recall_at_k(ranked, relevant, 100) == 1.0
    assert mrr_at_k(ranked, relevant, 10) == 0.5
    assert ndcg_at_k([], relevant) == 0.0


@pytest.mark.django_db
def test_evaluation_on_a_tiny_beir_dataset(tmp_path):
    topics = [
        "volcano eruptions magma",
        "coral reef bleaching",
        "honey bee colonies",
        "glacier retreat ice",
        "desert cactus water",
    ]
    corpus = [
        {"_id": f"d{i}", "title": t.title(), "text": f"A study of {t} and related effects."}
        for i, t in enumerate(topics)
    ]
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in corpus))
    (tmp_path / "queries.jsonl").write_text(
        "\n".join(json.dumps({"_id": f"q{i}", "text": t}) for i, t in enumerate(topics))
    )
    (tmp_path / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(topics)))
    )
    metrics = evaluate(tmp_path, split="test")
    assert metrics["documents"] == 5 and metrics["queries"] == 5
    assert metrics["ndcg@10"] == 1.0 and metrics["recall@100"] == 1.0 and metrics["mrr@10"] == 1.0
    assert metrics["reused_space"] is False
    again = evaluate(tmp_path, split="test", legs=("keyword",))
    assert again["reused_space"] is True and again["ndcg@10"] == 1.0
