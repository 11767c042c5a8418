"""Fagin's Threshold Algorithm under a postings budget, independent of where the lists live.

Fagin, Lotem & Naor, "Optimal aggregation algorithms for middleware" (PODS 2001): TA with the
CA refinement (candidates are upper-bounded before random access). The caller provides the two
accesses: ``read(lists, blocks)`` returns the next ``blocks[j]`` postings ``(j, node, impact)``
of each list ``lists[j]`` in impact order (resuming where that list's last read stopped), and
``resolve(nodes)`` returns the exact scores of the visible ones among ``nodes`` (the others
absent). A list's contribution to a score is at most ``weight[i]`` × its impact.

The budget (:func:`budget_of`) bounds the sorted reads by k and the query's terms: round 1
reads :data:`FIRST_ROUND_SHARE` of it split over the lists in proportion to their idf (a rare
term's list is short and decides the ranking; a common term's list is long and flat), later
rounds the lists holding the threshold up, within what is left. The answer is exact when TA's
stopping rule holds within the budget (the k-th score above the threshold, no candidate's bound
reaching it); otherwise the round that spends the budget resolves its best-bounded ``k``
candidates and the best resolved answer (``trace["exact"]`` false). Past the budget the lists
are read on only while fewer than ``k`` visible nodes are known, so an answer is never short
while a list could still fill it.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Callable

FIRST_BLOCK = 32  # postings per list and round at least (budget permitting)
MAX_BLOCK = 4096
# The budget of one query (:func:`budget_of`), chosen by measurement (docs/benchmarks.md,
# "The PostgreSQL keyword leg under a postings budget"): recall@10 against exact BM25 and
# SciFact keyword nDCG@10 kept, p95 bounded.
POSTINGS_BUDGET_MIN = 4096
POSTINGS_PER_RESULT = 64
FIRST_ROUND_SHARE = 0.5  # of the budget read in round 1, split by idf
# After round 1, a list is read when its weight × last impact is at least this share of the
# largest (any schedule keeps the algorithm exact; this one lowers the threshold fastest).
READ_SHARE = 0.5
RESOLVE_MIN = 32  # candidates resolved per round at least (and per statement when draining)
UNBOUNDED = sys.maxsize

Read = Callable[[list[int], list[int]], list[tuple[int, str, float]]]
Resolve = Callable[[list[str]], dict[str, float]]


def budget_of(limit: int, terms: int) -> int:
    """Postings one query may read: :data:`POSTINGS_PER_RESULT` per requested result, at least
    :data:`POSTINGS_BUDGET_MIN`, plus :data:`FIRST_BLOCK` per term beyond the eighth."""
    return max(POSTINGS_BUDGET_MIN, POSTINGS_PER_RESULT * limit) + FIRST_BLOCK * max(0, terms - 8)


def first_blocks(weights: list[float], budget: int, limit: int) -> list[int]:
    """Round 1's ``LIMIT`` per list: :data:`FIRST_ROUND_SHARE` of the budget in proportion to
    ``weights`` (idf), each at least max(:data:`FIRST_BLOCK`, limit / 2) and at most
    :data:`MAX_BLOCK`; scaled down when those minima overrun the budget (hundreds of lexemes)."""
    total = sum(weights) or 1.0
    floor = max(FIRST_BLOCK, limit // 2)
    share = FIRST_ROUND_SHARE * budget
    blocks = [min(MAX_BLOCK, max(floor, int(share * w / total))) for w in weights]
    spent = sum(blocks)
    if spent > budget:
        blocks = [max(1, b * budget // spent) for b in blocks]
    return blocks


def next_blocks(lists: list[int], block: list[int], left: int) -> list[int]:
    """The lists a later round reads within ``left`` postings, each block cut to an equal share
    (at least :data:`FIRST_BLOCK`; when that does not fit, only the first lists, which the
    caller orders by weight × last impact)."""
    lists = lists[: max(1, min(len(lists), left // FIRST_BLOCK))]
    room = max(1, left // len(lists))
    for i in lists:
        block[i] = min(block[i], room)
    return lists


def top_k(
    read: Read,
    resolve: Resolve,
    weight: list[float],
    limit: int,
    *,
    bounded: bool = True,
    trace: dict | None = None,
) -> list[tuple[str, float]]:
    """The best ``limit`` ``(node, score)`` by score, then node id (lower-case UUID text) —
    exact unless the budget ran out first (module docstring). ``bounded=False``: no budget,
    blocks of max(:data:`FIRST_BLOCK`, limit) per list, always exact."""
    m = len(weight)
    budget = budget_of(limit, m) if bounded else UNBOUNDED
    last = [1e9] * m  # last impact read, 0 once a list is exhausted
    live = [True] * m
    block = first_blocks(weight, budget, limit) if bounded else [max(FIRST_BLOCK, limit)] * m
    best: list[tuple[float, int, str]] = []  # min-heap: worst (score, -id) on top
    done: set[str] = set()  # resolved or ruled out
    pending: dict[str, dict[int, float]] = {}
    rounds = postings = resolved = 0
    exact = True
    while True:
        # Round 1 reads every list; later rounds the lists holding the threshold up.
        lists = [i for i in range(m) if live[i]]
        if rounds and lists:
            top_share = max(weight[i] * last[i] for i in lists)
            lists = [i for i in lists if weight[i] * last[i] >= READ_SHARE * top_share]
            lists.sort(key=lambda i: -weight[i] * last[i])
            if postings < budget:  # the last blocks share what is left of the budget
                lists = next_blocks(lists, block, budget - postings)
        if lists:
            rounds += 1
            got = [0] * m
            for j, node, impact in read(lists, [block[i] for i in lists]):
                i = lists[j]
                got[i] += 1
                last[i] = impact
                if node not in done:
                    pending.setdefault(node, {})[i] = impact
            postings += sum(got)
            for i in lists:
                if got[i] < block[i]:
                    live[i], last[i] = False, 0.0
                block[i] = min(2 * block[i], MAX_BLOCK)
        unseen = sum(weight[i] * last[i] for i in range(m) if live[i])
        # A candidate's bound: its seen impacts, plus the last impact of each live list it was
        # not seen in (never below ``unseen``). Computed once per round; it only falls later.
        floor = [weight[i] * last[i] if live[i] else 0.0 for i in range(m)]
        bounds = []
        for node, seen in pending.items():
            bound = unseen
            for i, impact in seen.items():
                bound += weight[i] * impact - floor[i]
            bounds.append((bound, node))
        bounds.sort(reverse=True)
        # Random access is some hundred times dearer than a sorted read (primary-key probes
        # against postings packed in index leaves), so while lists are live each round resolves
        # at most ``limit`` candidates, best bound first; deeper rounds tighten the others.
        draining = not any(live)
        left = len(bounds) if draining else max(limit, RESOLVE_MIN)
        position = 0
        while position < len(bounds) and left > 0:
            kth = best[0][0] if len(best) >= limit else -1.0
            if bounds[position][0] < kth:
                break  # neither it nor any later one can reach the k-th score
            take = [node for _, node in bounds[position : position + min(left, 4 * limit)]]
            position += len(take)
            left -= len(take)
            scores = resolve(take)
            resolved += len(take)
            for node in take:
                done.add(node)
                del pending[node]
                score = scores.get(node)
                if score is None:
                    continue
                entry = (score, -int(node.replace("-", ""), 16), node)
                if len(best) < limit:
                    heapq.heappush(best, entry)
                elif entry > best[0]:
                    heapq.heapreplace(best, entry)
        kth = best[0][0] if len(best) >= limit else -1.0
        for bound, node in bounds[position:]:
            if bound < kth:  # ruled out for good: bounds only fall, the k-th score only rises
                done.add(node)
                del pending[node]
        if not pending and (draining or kth > unseen):
            break
        if postings >= budget and len(best) >= limit:
            exact = False  # the budget is spent: the best resolved candidates answer
            break
    if trace is not None:
        trace.update(
            path="threshold",
            rounds=rounds,
            postings=postings,
            resolved=resolved,
            budget=budget if bounded else None,
            exact=exact,
        )
    return [(node, score) for score, _, node in sorted(best, key=lambda e: (-e[0], e[2]))]
