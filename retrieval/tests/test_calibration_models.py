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
