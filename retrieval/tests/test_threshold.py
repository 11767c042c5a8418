"""The Threshold Algorithm under a postings budget (:mod:`retrieval.backends.threshold`), over
in-memory impact lists: exact when unbounded or when its stopping rule holds within the budget;
otherwise the sorted reads stay within the budget, the scores returned are exact, and the answer
is never short while a list could still fill it. (The PostgreSQL lists themselves:
``test_pg_keyword.py``.)"""

from __future__ import annotations

import random
import uuid

import pytest

from retrieval.backends import threshold


class Lists:
    """Impact lists in the order the SQL reads them (impact, then node id, descending), with
    per-list resume positions; ``visible`` nodes are the ones random access scores."""

    def __init__(self, postings: dict[str, dict[int, float]], weight, visible=None) -> None:
        self.postings, self.weight = postings, weight
        self.visible = set(postings) if visible is None else visible
        m = len(weight)
        self.lists = [
            sorted(
                ((p[i], node) for node, p in postings.items() if i in p),
                reverse=True,
            )
            for i in range(m)
        ]
        self.position = [0] * m
        self.read_rows = 0

    def read(self, lists, blocks):
        rows = []
        for j, (i, size) in enumerate(zip(lists, blocks, strict=True)):
            part = self.lists[i][self.position[i] : self.position[i] + size]
            self.position[i] += len(part)
            rows += [(j, node, impact) for impact, node in part]
        self.read_rows += len(rows)
        return rows

    def score(self, node: str) -> float:
        return sum(self.weight[i] * v for i, v in self.postings[node].items())

    def resolve(self, nodes):
        return {n: self.score(n) for n in nodes if n in self.visible}

    def exact(self, limit: int):
        scores = [(n, self.score(n)) for n in self.visible]
        return sorted(scores, key=lambda kv: (-kv[1], kv[0]))[:limit]


def corpus(seed: int, nodes: int, m: int, *, flat: bool) -> tuple[dict, list[float]]:
    """Random postings: each node holds each term with probability 0.3. ``flat``: impacts in a
    narrow band (long lists that TA must read deep); otherwise spread out."""
    rng = random.Random(seed)
    postings: dict[str, dict[int, float]] = {}
    for _ in range(nodes):
        p = {
            i: (0.9 + 0.1 * rng.random()) if flat else rng.random() ** 3
            for i in range(m)
            if rng.random() < 0.3
        }
        if p:
            postings[str(uuid.UUID(int=rng.getrandbits(128)))] = p
    weight = [1.0 + rng.random() for _ in range(m)]
    return postings, weight


@pytest.mark.parametrize("seed", range(6))
def test_unbounded_and_proved_answers_equal_the_exact_top_k(seed):
    postings, weight = corpus(seed, 3000, 5, flat=False)
    for limit in (1, 10, 50):
        want = Lists(postings, weight).exact(limit)
        lists = Lists(postings, weight)
        assert threshold.top_k(lists.read, lists.resolve, weight, limit, bounded=False) == want
        lists, trace = Lists(postings, weight), {}
        got = threshold.top_k(lists.read, lists.resolve, weight, limit, trace=trace)
        if trace["exact"]:
            assert got == want
        assert trace["postings"] == lists.read_rows <= trace["budget"]


def test_the_budget_bounds_sorted_reads_of_flat_lists(monkeypatch):
    """Flat lists (every impact within 10 % of the others) make the stopping rule hold only deep
    in the lists: unbounded, TA reads most of them; under the budget it stops at the budget, and
    the scores it returns are the exact scores of those nodes, best first."""
    postings, weight = corpus(7, 20_000, 10, flat=True)
    total = sum(len(p) for p in postings.values())
    unbounded = Lists(postings, weight)
    trace_u: dict = {}
    want = threshold.top_k(unbounded.read, unbounded.resolve, weight, 10, bounded=False,
                           trace=trace_u)  # fmt: skip
    assert want == unbounded.exact(10)
    assert trace_u["postings"] > total / 4  # the exact answer needs a deep read
    budget = threshold.budget_of(10, 10)
    lists, trace = Lists(postings, weight), {}
    got = threshold.top_k(lists.read, lists.resolve, weight, 10, trace=trace)
    assert trace["exact"] is False
    assert trace["postings"] == lists.read_rows <= budget < trace_u["postings"]
    assert len(got) == 10
    assert all(score == pytest.approx(lists.score(node)) for node, score in got)
    assert got == sorted(got, key=lambda kv: (-kv[1], kv[0]))
    # (How close a bounded answer comes to the exact one is a property of real text, measured
    # on SciFact by bench/pg_keyword.py: random flat lists are its worst case.)


def test_the_answer_is_never_short_past_the_budget(monkeypatch):
    """The best-impact postings of every list belong to nodes random access rejects (a disabled
    document, a superseded generation, a filter): past the budget the lists are read on until
    ``limit`` visible nodes are known."""
    monkeypatch.setattr(threshold, "POSTINGS_BUDGET_MIN", 64)
    monkeypatch.setattr(threshold, "POSTINGS_PER_RESULT", 1)
    postings, weight = corpus(9, 2000, 3, flat=False)
    ranked = sorted(postings, key=lambda n: -max(postings[n].values()))
    visible = set(ranked[600:])  # the 600 best-impact nodes are invisible
    lists, trace = Lists(postings, weight, visible), {}
    got = threshold.top_k(lists.read, lists.resolve, weight, 20, trace=trace)
    assert len(got) == 20
    assert {node for node, _ in got} <= visible
    assert trace["postings"] > trace["budget"] == 64


def test_round_one_blocks_follow_idf_and_stay_within_the_budget():
    blocks = threshold.first_blocks([8.0, 4.0, 0.1, 0.1], 4096, 50)
    assert blocks == [1342, 671, 32, 32]  # half the budget by idf, floor max(32, 50 // 2)
    many = threshold.first_blocks([1.0] * 500, threshold.budget_of(50, 500), 50)
    assert sum(many) <= threshold.budget_of(50, 500)
