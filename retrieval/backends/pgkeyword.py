"""PostgreSQL keyword leg: BM25 over per-term impact lists, top-k by the Threshold Algorithm.

Tables (migration ``retrieval.0010``):

- ``retrieval_keyword_posting (node_id, term, space_id, tf, impact)``: one row per node and
  lexeme. Primary key ``(node_id, term)`` (a node's postings: deletes); btree ``(space_id,
  term, impact, node_id)`` read backwards (the sorted access: a term's list best impact first,
  resumed by keyset ``(impact, node_id) < (…)``).
- ``retrieval_keyword_node (node_id, space_id, length, terms, tfs, document_id, generation)``:
  one row per indexed node (also a node without lexemes); ``length`` = the node's token count
  (Σ tf); ``terms`` / ``tfs`` = its lexemes (sorted) and their tf, the node's postings as one
  row (migration ``retrieval.0015``): the random access reads this row, not one posting per
  query term; ``document_id`` / ``generation`` = the node's (immutable), so visibility is one
  probe of the document.
- ``retrieval_keyword_term (space_id, term, df)``: document frequency per lexeme of a space.
- ``retrieval_keyword_space (space_id, nodes, length, avgdl)``: N, Σ length, and the frozen
  average length the impacts were computed with.

Terms are PostgreSQL's lexemes, ``to_tsvector('english', keyword_text(text))`` (english stemming
and stop words; CJK runs as bigrams, :mod:`retrieval.text`); ``tf`` is the lexeme's position
count (PostgreSQL keeps at most 256 positions per lexeme). ``term`` is ``COLLATE "C"``, so the
lexemes that start with one character are a btree range (the lone-CJK-character prefix rule).

Score: BM25 with k1 = 1.2, b = 0.75 and the SQLite leg's idf (:func:`idf`: FTS5's
``ln((N − df + 0.5)/(df + 0.5))``, at least a hundredth of Lucene's ``ln(1 + …)``), from the live
statistics of the space (every indexed node of every stored generation counts, as in Lucene
before merges):
``Σ_t idf_t · tf(k1+1)/(tf + k1(1 − b + b·dl/avgdl))``, summed in term order.

Impacts: a posting's ``impact`` is its tf-component under the space's frozen ``avgdl`` A₀ (set by
the first write into an empty space, refreshed by :func:`rebuild`). With the live average A, a
node's true tf-component is at most ``max(1, A/A₀)`` times its impact (the length normaliser
``1 − b + b·dl/A`` shrinks by at most A₀/A when A grows), so the bounds below stay valid however
the space grows; only their tightness drifts until a rebuild.

Query: the Threshold Algorithm under a postings budget, :mod:`retrieval.backends.threshold`
(Fagin, Lotem & Naor, PODS 2001, with the CA refinement): each round reads live term lists in
impact order, one block per list (:data:`SORTED_SQL`, a ``LIMIT`` per list); candidates whose
upper bound can still reach the k-th score are resolved by random access (:data:`RANDOM_SQL`:
their postings of all query terms, length and visibility in one statement) to their exact
score. The answer is the exact BM25 top-k over visible nodes (ties by node id) when the
algorithm's stopping rule holds within the budget; past it, the best resolved candidates.
"""

from __future__ import annotations

import heapq
import math
import uuid
from collections.abc import Iterable

from retrieval.text import keyword_text

from . import threshold

POSTING = "retrieval_keyword_posting"
NODE = "retrieval_keyword_node"
TERM = "retrieval_keyword_term"
SPACE = "retrieval_keyword_space"

K1 = 1.2
B = 0.75
LEX_BATCH = 500  # nodes per to_tsvector statement
ROW_BATCH = 20_000  # postings per INSERT
PREFIX_TERMS = 64  # lexemes a lone CJK character expands to (highest df first)
# Impacts are stored as float4 (relative error ≤ 2⁻²⁴); bounds are widened by this factor.
MARGIN = 1.0 + 2.0**-20
# A documents filter allowing at most this many nodes is answered exactly over those nodes
# (cost ∝ the filter), wider ones by the Threshold Algorithm with the filter in its random access.
DIRECT_FILTER_NODES = 10_000
MAX_UUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"
# Joins a node's lexemes into one text parameter of the node insert (a lexeme never holds a
# control character: the parser splits on them).
TERM_SEPARATOR = "\x1f"

LEX_SQL = (
    "SELECT i, coalesce(array_agg(lexeme ORDER BY lexeme) FILTER (WHERE lexeme IS NOT NULL), "
    "'{}'), coalesce(array_agg(tf ORDER BY lexeme) FILTER (WHERE lexeme IS NOT NULL), '{}') "
    'FROM (SELECT s.i, l.lexeme::text COLLATE "C" AS lexeme, '
    "coalesce(cardinality(l.positions), 1) AS tf "
    "FROM unnest(%s::text[]) WITH ORDINALITY s(body, i) "
    "LEFT JOIN LATERAL unnest(to_tsvector('english', s.body)) l ON true) x GROUP BY i"
)

QUERY_TERMS_SQL = (
    "SELECT t.term, t.df FROM (SELECT DISTINCT l.lexeme::text AS term "
    "FROM unnest(%s::text[]) q(t) CROSS JOIN LATERAL unnest(to_tsvector('english', q.t)) l) x "
    f"JOIN {TERM} t ON t.space_id = %s AND t.term = x.term "
    "UNION SELECT p.term, p.df FROM unnest(%s::text[], %s::text[]) q(lo, hi) "
    f"CROSS JOIN LATERAL (SELECT term, df FROM {TERM} WHERE space_id = %s "
    f"AND term >= q.lo AND term < q.hi ORDER BY df DESC, term LIMIT {PREFIX_TERMS}) p"
)

# Sorted access: the next block of every live list, best impact first (index scan backward
# of (space_id, term, impact, node_id) under LIMIT, resumed after the last row read).
SORTED_SQL = (
    "SELECT u.i, p.node_id::text, p.impact "
    "FROM unnest(%s::text[], %s::real[], %s::uuid[], %s::int[]) "
    "WITH ORDINALITY u(term, impact, node_id, lim, i) "
    f"CROSS JOIN LATERAL (SELECT p.node_id, p.impact FROM {POSTING} p "
    "WHERE p.space_id = %s AND p.term = u.term AND (p.impact, p.node_id) < (u.impact, u.node_id) "
    "ORDER BY p.impact DESC, p.node_id DESC LIMIT u.lim) p"
)

# Random access: candidates' length, their tf of the query terms (from the node row's term
# vector: one heap tuple per candidate, where the postings' primary key cost a probe and a heap
# page per term) and their visibility (generation = the document's active one, enabled, the
# filter; the node's document and generation, which never change, are copied into its row) as
# a scalar subquery per candidate, so every lookup is a primary-key probe.
VISIBLE = (
    "(SELECT k.generation = d.active_generation AND d.enabled {only}"
    "FROM ingestion_document d WHERE d.id = k.document_id)"
)
RANDOM_SQL = (
    f"SELECT k.node_id::text, k.length, p.term, p.tf FROM {NODE} k "
    "CROSS JOIN LATERAL (SELECT * FROM unnest(k.terms, k.tfs) t(term, tf) "
    "WHERE t.term = ANY(%s::text[])) p "
    "WHERE k.node_id = ANY(%s::uuid[]) AND k.space_id = %s AND " + VISIBLE
)
# The exact answer over the nodes of a small set of documents (the filter's own rows).
DIRECT_SQL = (
    f"SELECT k.node_id::text, k.length, p.term, p.tf FROM ingestion_document d "
    "JOIN ingestion_knowledgenode n ON n.document_id = d.id AND n.generation = d.active_generation "
    f"JOIN {NODE} k ON k.node_id = n.id "
    f"JOIN {POSTING} p ON p.node_id = n.id AND p.term = ANY(%s::text[]) "
    "WHERE d.id = ANY(%s::uuid[]) AND d.enabled AND d.space_id = %s AND k.space_id = %s"
)
# Every matching visible posting: the exhaustive reference (benchmarks, tests).
EXHAUSTIVE_SQL = (
    f"SELECT k.node_id::text, k.length, p.term, p.tf FROM {POSTING} p "
    f"JOIN {NODE} k ON k.node_id = p.node_id "
    "WHERE p.space_id = %s AND p.term = ANY(%s::text[]) AND " + VISIBLE
)


#: The floor of a common term's idf, as a share of Lucene's: the SQLite leg's
#: :data:`retrieval.keyword_index.analysis.MIN_BOOST` (the two legs weigh terms alike).
MIN_IDF_SHARE = 0.01


def idf(nodes: int, df: int) -> float:
    """The keyword legs' idf: FTS5's ``ln((N − df + 0.5)/(df + 0.5))``, at least a hundredth of
    Lucene's ``ln(1 + (N − df + 0.5)/(df + 0.5))`` (a term in half the nodes or more) — what
    the SQLite leg scores (tantivy's Lucene idf times
    :func:`retrieval.keyword_index.analysis.idf_boost`), so both engines rank alike. With
    Lucene's idf alone a common term kept most of its weight here and almost none there: in a
    space of a few documents sharing words, a long chunk repeating them outranked the chunk both
    legs found, which then fell out of the fused top k on PostgreSQL only."""
    ratio = (nodes - df + 0.5) / (df + 0.5)
    lucene = math.log1p(ratio)
    return max(math.log(ratio), MIN_IDF_SHARE * lucene)


def tf_component(tf: int, length: int, avgdl: float) -> float:
    """BM25's term-frequency part ``tf(k1+1)/(tf + k1(1 − b + b·dl/avgdl))``."""
    return tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * length / avgdl))


def prefix_range(char: str) -> tuple[str, str]:
    """``[char, next code point)``: under ``COLLATE "C"`` the lexemes starting with ``char``."""
    return char, chr(ord(char) + 1)


# --- writes -------------------------------------------------------------------------------------
def lock_spaces(cursor, space_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, tuple[int, int, float]]:
    """Create missing statistics rows and lock the spaces' rows in id order (every writer takes
    them first, so writers of one space serialise and never deadlock on term rows).
    Returns ``{space: (nodes, length, avgdl)}``."""
    ids = sorted(set(space_ids))
    cursor.execute(
        f"INSERT INTO {SPACE} (space_id, nodes, length, avgdl) "
        "SELECT s, 0, 0, 0 FROM unnest(%s::uuid[]) s ORDER BY s ON CONFLICT DO NOTHING",
        [ids],
    )
    cursor.execute(
        f"SELECT space_id, nodes, length, avgdl FROM {SPACE} WHERE space_id = ANY(%s::uuid[]) "
        "ORDER BY space_id FOR UPDATE",
        [ids],
    )
    return {row[0]: (row[1], row[2], row[3]) for row in cursor.fetchall()}


def lex(cursor, texts: list[str]) -> list[tuple[list[str], list[int]]]:
    """``(lexemes, tfs)`` of each text under the english configuration (after
    :func:`keyword_text`), lexemes in ``COLLATE "C"`` order."""
    out: list[tuple[list[str], list[int]]] = [([], []) for _ in texts]
    for start in range(0, len(texts), LEX_BATCH):
        chunk = [keyword_text(t) for t in texts[start : start + LEX_BATCH]]
        cursor.execute(LEX_SQL, [chunk])
        for i, lexemes, tfs in cursor.fetchall():
            out[start + i - 1] = (list(lexemes), list(tfs))
    return out


def write(cursor, nodes: list, *, avgdl: float | None = None) -> None:
    """Index ``nodes`` (objects with ``id``, ``space_id``, ``text``) in the caller's
    transaction: node rows, postings, df upserts and the space's N and Σ length. ``avgdl`` fixes
    A₀ of a space that has no postings yet (a rebuild passes the space's true average)."""
    if not nodes:
        return
    stats = lock_spaces(cursor, (n.space_id for n in nodes))
    lexed = lex(cursor, [n.text for n in nodes])
    frozen: dict[uuid.UUID, float] = {}
    batch: dict[uuid.UUID, list[int]] = {}
    for n, (_, tfs) in zip(nodes, lexed, strict=True):
        batch.setdefault(n.space_id, []).append(sum(tfs))
    for space_id, lengths in batch.items():
        _, length, stored = stats[space_id]
        if length > 0:
            frozen[space_id] = stored
        else:
            frozen[space_id] = avgdl or max(1.0, sum(lengths) / len(lengths))
    node_rows: tuple[list, list, list, list, list] = ([], [], [], [], [])
    postings: tuple[list, list, list, list, list] = ([], [], [], [], [])
    df: dict[tuple[uuid.UUID, str], int] = {}
    for n, (lexemes, tfs) in zip(nodes, lexed, strict=True):
        length = sum(tfs)
        node_rows[0].append(n.id)
        node_rows[1].append(n.space_id)
        node_rows[2].append(length)
        node_rows[3].append(TERM_SEPARATOR.join(lexemes))
        node_rows[4].append(",".join(map(str, tfs)))
        a0 = frozen[n.space_id]
        for term, tf in zip(lexemes, tfs, strict=True):
            postings[0].append(n.id)
            postings[1].append(term)
            postings[2].append(n.space_id)
            postings[3].append(tf)
            postings[4].append(tf_component(tf, length, a0))
            key = (n.space_id, term)
            df[key] = df.get(key, 0) + 1
    cursor.execute(
        f"INSERT INTO {NODE} (node_id, space_id, length, terms, tfs, document_id, generation) "
        "SELECT u.i, u.s, u.l, string_to_array(u.t, %s), string_to_array(u.f, ',')::smallint[], "
        "n.document_id, n.generation "
        "FROM unnest(%s::uuid[], %s::uuid[], %s::int[], %s::text[], %s::text[]) u(i, s, l, t, f) "
        "LEFT JOIN ingestion_knowledgenode n ON n.id = u.i",
        [TERM_SEPARATOR, *node_rows],
    )
    for start in range(0, len(postings[0]), ROW_BATCH):
        cursor.execute(
            f"INSERT INTO {POSTING} (node_id, term, space_id, tf, impact) "
            "SELECT * FROM unnest(%s::uuid[], %s::text[], %s::uuid[], %s::int[], %s::real[])",
            [column[start : start + ROW_BATCH] for column in postings],
        )
    keys = sorted(df)
    for start in range(0, len(keys), ROW_BATCH):
        part = keys[start : start + ROW_BATCH]
        cursor.execute(
            f"INSERT INTO {TERM} AS t (space_id, term, df) "
            "SELECT * FROM unnest(%s::uuid[], %s::text[], %s::int[]) ORDER BY 1, 2 "
            "ON CONFLICT (space_id, term) DO UPDATE SET df = t.df + EXCLUDED.df",
            [[k[0] for k in part], [k[1] for k in part], [df[k] for k in part]],
        )
    for space_id, lengths in batch.items():
        cursor.execute(
            f"UPDATE {SPACE} SET nodes = nodes + %s, length = length + %s, avgdl = %s "
            "WHERE space_id = %s",
            [len(lengths), sum(lengths), frozen[space_id], space_id],
        )


def delete(cursor, node_ids: list[uuid.UUID]) -> None:
    """Remove the nodes' rows and subtract them from df, N and Σ length (caller's transaction;
    a term whose df reaches 0 is removed)."""
    if not node_ids:
        return
    ids = list(node_ids)
    cursor.execute(f"SELECT DISTINCT space_id FROM {NODE} WHERE node_id = ANY(%s::uuid[])", [ids])
    spaces = [row[0] for row in cursor.fetchall()]
    if not spaces:
        return
    lock_spaces(cursor, spaces)
    cursor.execute(
        f"WITH gone AS (DELETE FROM {POSTING} WHERE node_id = ANY(%s::uuid[]) "
        "RETURNING space_id, term), "
        "counts AS (SELECT space_id, term, count(*) AS c FROM gone GROUP BY 1, 2), "
        f"updated AS (UPDATE {TERM} t SET df = t.df - c.c FROM counts c "
        "WHERE t.space_id = c.space_id AND t.term = c.term RETURNING t.space_id, t.term, t.df) "
        "SELECT space_id, term FROM updated WHERE df <= 0",
        [ids],
    )
    empty = cursor.fetchall()
    if empty:
        cursor.execute(
            f"DELETE FROM {TERM} WHERE (space_id, term) IN "
            "(SELECT * FROM unnest(%s::uuid[], %s::text[])) AND df <= 0",
            [[r[0] for r in empty], [r[1] for r in empty]],
        )
    cursor.execute(
        f"WITH gone AS (DELETE FROM {NODE} WHERE node_id = ANY(%s::uuid[]) "
        "RETURNING space_id, length), "
        "sums AS (SELECT space_id, count(*) AS n, sum(length) AS l FROM gone GROUP BY 1) "
        f"UPDATE {SPACE} s SET nodes = s.nodes - sums.n, length = s.length - sums.l "
        "FROM sums WHERE s.space_id = sums.space_id",
        [ids],
    )


def rebuild(cursor, space_id: uuid.UUID) -> int:
    """Rebuild the space's postings and statistics from its nodes (every generation stored),
    with A₀ = the space's true average length (a first pass over the texts measures it).
    Streams the nodes by id, :data:`LEX_BATCH` × 4 at a time. Returns the nodes indexed."""
    lock_spaces(cursor, [space_id])
    for table in (POSTING, TERM, NODE):
        cursor.execute(f"DELETE FROM {table} WHERE space_id = %s", [space_id])
    cursor.execute(
        f"UPDATE {SPACE} SET nodes = 0, length = 0, avgdl = 0 WHERE space_id = %s", [space_id]
    )
    count = total = 0
    for rows in _space_nodes(cursor, space_id):
        count += len(rows)
        total += sum(sum(tfs) for _, tfs in lex(cursor, [r.text for r in rows]))
    if not count:
        return 0
    avgdl = max(1.0, total / count)
    for rows in _space_nodes(cursor, space_id):
        write(cursor, rows, avgdl=avgdl)
    return count


def _space_nodes(cursor, space_id: uuid.UUID):
    """The space's nodes as :class:`_Row` lists in id order (keyset pages)."""
    after = uuid.UUID(int=0)
    while True:
        cursor.execute(
            "SELECT id, space_id, text FROM ingestion_knowledgenode "
            "WHERE space_id = %s AND id > %s ORDER BY id LIMIT %s",
            [space_id, after, LEX_BATCH * 4],
        )
        rows = [_Row(*r) for r in cursor.fetchall()]
        if not rows:
            return
        yield rows
        after = rows[-1].id


class _Row:
    __slots__ = ("id", "space_id", "text")

    def __init__(self, node_id, space_id, text):
        self.id, self.space_id, self.text = node_id, space_id, text


def row_count(cursor, space_id: uuid.UUID) -> int:
    """Indexed nodes of the space (all generations)."""
    cursor.execute(f"SELECT count(*) FROM {NODE} WHERE space_id = %s", [space_id])
    return cursor.fetchone()[0]


# --- reads --------------------------------------------------------------------------------------
class Scorer:
    """Exact BM25 of nodes from their ``(length, {term: tf})`` under one space's statistics;
    ``terms`` sorted, ``idfs`` aligned with them (the summation order)."""

    def __init__(self, nodes: int, length: int, lexemes: list[tuple[str, int]]) -> None:
        self.terms = [t for t, _ in lexemes]
        self.idfs = [idf(nodes, df) for _, df in lexemes]
        self.avgdl = length / nodes if nodes else 1.0

    def score(self, length: int, tfs: dict[str, int]) -> float:
        total = 0.0
        for term, weight in zip(self.terms, self.idfs, strict=True):
            tf = tfs.get(term)
            if tf:
                total += weight * tf_component(tf, length, self.avgdl)
        return total

    def score_rows(self, rows) -> dict[str, float]:
        """Scores of ``(node_id, length, term, tf)`` rows, per node (ids as text: the hot path
        builds no UUID objects; lower-case hex text sorts as the UUIDs do)."""
        grouped: dict[str, tuple[int, dict[str, int]]] = {}
        for node_id, length, term, tf in rows:
            grouped.setdefault(node_id, (length, {}))[1][term] = tf
        return {node: self.score(length, tfs) for node, (length, tfs) in grouped.items()}


def top(scores: dict[str, float], limit: int) -> list[tuple[str, float]]:
    """The best ``limit`` of ``scores``, score descending then node id ascending."""
    return heapq.nsmallest(limit, scores.items(), key=lambda item: (-item[1], item[0]))


def space_statistics(cursor, space_id: uuid.UUID) -> tuple[int, int, float] | None:
    """``(N, Σ length, A₀)`` of the space, ``None`` when nothing was ever indexed."""
    cursor.execute(f"SELECT nodes, length, avgdl FROM {SPACE} WHERE space_id = %s", [space_id])
    row = cursor.fetchone()
    return None if row is None else (row[0], row[1], row[2])


def query_lexemes(
    cursor, space_id: uuid.UUID, terms: list[str], prefix: list[bool]
) -> list[tuple[str, int]]:
    """``[(lexeme, df)]`` sorted, of the query terms present in the space: each plain term's
    english lexemes, each prefix term's (a lone CJK character) up to :data:`PREFIX_TERMS`
    lexemes starting with it, most frequent first."""
    plain = [t for t, p in zip(terms, prefix, strict=True) if not p]
    ranges = [prefix_range(t) for t, p in zip(terms, prefix, strict=True) if p]
    cursor.execute(
        QUERY_TERMS_SQL,
        [plain, space_id, [r[0] for r in ranges], [r[1] for r in ranges], space_id],
    )
    return sorted((term, df) for term, df in cursor.fetchall() if df > 0)


def _visible(documents: list[str] | None) -> tuple[str, list]:
    if documents is None:
        return VISIBLE.format(only=""), []
    return VISIBLE.format(only="AND d.id = ANY(%s::uuid[]) "), [documents]


def random_access(cursor, space_id, scorer: Scorer, nodes: list, documents) -> dict:
    """Exact scores of the visible ones among ``nodes`` (the others are absent)."""
    visible, extra = _visible(documents)
    sql = RANDOM_SQL.replace(VISIBLE, visible)
    cursor.execute(sql, [scorer.terms, nodes, space_id, *extra])
    return scorer.score_rows(cursor.fetchall())


def search(
    cursor,
    space_id: uuid.UUID,
    terms: list[str],
    prefix: list[bool],
    limit: int,
    documents: list[str] | None = None,
    *,
    trace: dict | None = None,
    bounded: bool = True,
) -> list[tuple[str, float]]:
    """The BM25 top ``limit`` visible nodes of the space for ``terms`` as ``(node id as text,
    score)`` (``prefix[i]``: the term is a lone CJK character), ``documents`` (ids as strings)
    restricting them: exact when proved within the postings budget (``bounded=False``: always).
    ``trace`` (optional) receives the work done: rounds, postings read, candidates resolved,
    budget, whether proved exact."""
    stats = space_statistics(cursor, space_id)
    if stats is None or stats[0] <= 0 or limit <= 0:
        return []
    nodes, length, a0 = stats
    lexemes = query_lexemes(cursor, space_id, terms, prefix)
    if not lexemes:
        return []
    scorer = Scorer(nodes, length, lexemes)
    if documents is not None:
        cursor.execute(
            "SELECT coalesce(sum(node_count), 0) FROM ingestion_document "
            "WHERE id = ANY(%s::uuid[]) AND space_id = %s",
            [documents, space_id],
        )
        if cursor.fetchone()[0] <= DIRECT_FILTER_NODES:
            cursor.execute(DIRECT_SQL, [scorer.terms, documents, space_id, space_id])
            if trace is not None:
                trace["path"] = "direct"
            return top(scorer.score_rows(cursor.fetchall()), limit)
    return threshold_top_k(cursor, space_id, scorer, limit, a0, documents, trace, bounded)


def threshold_top_k(
    cursor, space_id, scorer: Scorer, limit: int, a0: float, documents, trace, bounded=True
):
    """:func:`retrieval.backends.threshold.top_k` over the space's impact lists: sorted access
    by :data:`SORTED_SQL` (each list resumed after its last row read), random access by
    :func:`random_access`; a list's weight is idf × the avgdl drift × the float4 margin."""
    m = len(scorer.terms)
    drift = max(1.0, scorer.avgdl / a0) if a0 > 0 else 1.0
    weight = [MARGIN * drift * w for w in scorer.idfs]
    resume = [(1e9, MAX_UUID)] * m

    def read(lists: list[int], blocks: list[int]) -> list[tuple[int, str, float]]:
        cursor.execute(
            SORTED_SQL,
            [
                [scorer.terms[i] for i in lists],
                [resume[i][0] for i in lists],
                [resume[i][1] for i in lists],
                blocks,
                space_id,
            ],
        )
        rows = [(j - 1, node, impact) for j, node, impact in cursor.fetchall()]
        for j, node, impact in rows:
            resume[lists[j]] = (impact, node)
        return rows

    def resolve(nodes: list[str]) -> dict[str, float]:
        return random_access(cursor, space_id, scorer, nodes, documents)

    return threshold.top_k(read, resolve, weight, limit, bounded=bounded, trace=trace)
