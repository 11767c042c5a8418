"""The calibrated fusion uses learned maps only: a space on another model ranks by min-max."""

import uuid
from types import SimpleNamespace

from retrieval.backends.base import ScoredNode
from retrieval.calibration import BGE_SMALL_ID, LEARNED, MINILM_ID, fuse_legs
from retrieval.recall import FUSIONS

A, B, C = (uuid.UUID(int=n) for n in (1, 2, 3))
# A is the lone exact keyword hit with a middling cosine; B and C are strong on a model whose
# cosines run high, weak on keyword.
LEGS = {
    "dense": [ScoredNode(B, 0.93), ScoredNode(C, 0.92), ScoredNode(A, 0.55)],
    "keyword": [ScoredNode(A, 9.0), ScoredNode(B, 0.4)],
}


def _order(fusion: str, model_id: str | None) -> list[uuid.UUID]:
    snapshot = SimpleNamespace(version=None if model_id is None else (1, model_id))
    return [row[0] for row in fuse_legs(fusion, LEGS, "", snapshot, 50)]


def test_a_model_without_learned_maps_ranks_by_minmax_under_calibrated():
    minmax = [row[0] for row in FUSIONS["minmax"](LEGS)]
    assert MINILM_ID not in LEARNED
    for model_id in (MINILM_ID, "dify/openai/text-embedding-3-small", None):
        assert _order("calibrated", model_id) == minmax


def test_the_embedded_default_ranks_by_its_learned_maps():
    assert BGE_SMALL_ID in LEARNED
    # bge's α 0.8 weighs the dense leg: B (cosine 0.93) passes A, the lone keyword hit, which
    # min-max's equal shares put first.
    assert _order("calibrated", BGE_SMALL_ID)[0] == B
    assert _order("minmax", BGE_SMALL_ID)[0] == A


def test_the_rerank_mix_follows_the_fusion_that_ranked_the_space():
    from retrieval.calibration import effective_fusion
    from retrieval.reranking import MIX_RELATIVE, mix, mix_parameters

    def on(model_id):
        return SimpleNamespace(version=(1, model_id))

    assert effective_fusion("calibrated", on(BGE_SMALL_ID)) == "calibrated"
    assert effective_fusion("calibrated", on(MINILM_ID)) == "minmax"
    assert effective_fusion("calibrated", SimpleNamespace(version=None)) == "minmax"
    assert effective_fusion("rrf", on(BGE_SMALL_ID)) == "rrf"
    absolute, relative = mix_parameters("calibrated"), mix_parameters("minmax")
    assert relative == mix_parameters("rrf") == MIX_RELATIVE and absolute[0] < relative[0]
    # Over an absolute first stage the cross-encoder breaks a near-tie but cannot lift a
    # clearly weaker candidate (0.60 against 0.80) past a stronger one; over a relative first
    # stage it can.
    assert mix(6.0, 0.80, *absolute) > mix(-6.0, 0.79, *absolute)
    assert mix(-6.0, 0.80, *absolute) < mix(6.0, 0.79, *absolute)
    assert mix(6.0, 0.60, *absolute) < mix(-6.0, 0.80, *absolute)
    assert mix(6.0, 0.60, *relative) > mix(-6.0, 0.80, *relative)
