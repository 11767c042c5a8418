"""Fusion across Research's queries: the weighted-max combination and the shared rerank pool."""

from __future__ import annotations

import uuid

Ranked = list[tuple[uuid.UUID, float, dict]]


def weighted_max(lists: list[Ranked], weights: list[float]) -> Ranked:
    """Combine ranked lists (best first, scores in [0, 1]) by weighted maximum.

    A candidate's score is ``max_i weights[i] × score_i`` over the lists holding it (so it
    stays in [0, 1]); being in several lists adds nothing. Ties go to the better rank in the
    first list (the original query), then the better rank in any list, then the node id.
    Each result's ``per_leg`` is the dense/keyword scores of the list that gave its score plus
    ``research`` (the combined score). With one list of weight 1 the order and the scores are
    that list's.
    """
    best: dict[uuid.UUID, tuple[float, dict]] = {}
    first_rank: dict[uuid.UUID, int] = {}
    any_rank: dict[uuid.UUID, int] = {}
    for index, (ranked, weight) in enumerate(zip(lists, weights, strict=True)):
        for rank, (node_id, score, per_leg) in enumerate(ranked, 1):
            value = weight * score
            if node_id not in best or value > best[node_id][0]:
                best[node_id] = (value, per_leg)
            any_rank[node_id] = min(rank, any_rank.get(node_id, rank))
            if index == 0:
                first_rank[node_id] = rank
    combined = [
        (node_id, value, {**per_leg, "research": value})
        for node_id, (value, per_leg) in best.items()
    ]
    combined.sort(key=lambda r: (-r[1], first_rank.get(r[0], 1 << 30), any_rank[r[0]], str(r[0])))
    return combined


def shared_pool(lists: list[Ranked], cap: int) -> tuple[list[uuid.UUID], list[int]]:
    """Take at most ``cap`` distinct candidates round-robin from ``lists`` (each best first).

    Returns the pool (in selection order) and how many candidates each list contributed: every
    list gets a turn in order, a candidate already taken is skipped, an exhausted list gives its
    turn away, so the shares differ by at most one unless a list runs out.
    """
    pool: list[uuid.UUID] = []
    taken: set[uuid.UUID] = set()
    counts = [0] * len(lists)
    cursors = [0] * len(lists)
    while len(pool) < cap:
        progressed = False
        for index, ranked in enumerate(lists):
            if len(pool) >= cap:
                break
            while cursors[index] < len(ranked) and ranked[cursors[index]][0] in taken:
                cursors[index] += 1
            if cursors[index] < len(ranked):
                node_id = ranked[cursors[index]][0]
                cursors[index] += 1
                taken.add(node_id)
                pool.append(node_id)
                counts[index] += 1
                progressed = True
        if not progressed:
            break
    return pool, counts
