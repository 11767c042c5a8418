"""The keyword index's schema, its text analyzer and the query built from a query's terms.

One tantivy document per knowledge node: ``node_id`` and ``document_id`` (32 hex characters,
``raw``: one term each), and ``text`` (:func:`retrieval.text.keyword_text` of the node's text,
analyzed by :data:`TOKENIZER`: tantivy's simple tokenizer (splits on every character that is
not alphanumeric), tokens over 40 bytes dropped, lower case, ASCII folding (FTS5's
``remove_diacritics``), Snowball English stemming). ``text`` keeps term frequencies but no
positions: the keyword leg never runs phrase queries. Ranking is tantivy's BM25 (k1 = 1.2,
b = 0.75) with each term query boosted by ``idf_fts5 / idf_lucene`` (:func:`idf_boost`), so a
term weighs what it weighed under FTS5's ``bm25()`` (idf ``ln((N - n + 0.5) / (n + 0.5))``,
floored) rather than Lucene's ``ln(1 + (N - n + 0.5) / (n + 0.5))``: on SciFact that is
nDCG@10 0.6845 against 0.6818 unboosted (FTS5: 0.6887; the rest is Snowball's English stemmer
against Porter's and tantivy's one-byte length norms). A disjunction of term queries is
evaluated with block-max WAND, so a top-k query skips the blocks that cannot enter the top k
(the boost scales a term's block maxima alike). The choices were measured
(docs/benchmarks.md, "Keyword engines").
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable

import tantivy

from retrieval.text import is_lone_cjk, keyword_terms

TOKENIZER = "kfs_text"
MAX_TOKEN_BYTES = 40
SCHEMA_VERSION = 1
"""Bumped when the schema or the analyzer changes: an index of another version is rebuilt."""


def build_schema() -> tantivy.Schema:
    """``node_id`` (stored, raw), ``document_id`` (raw), ``text`` (:data:`TOKENIZER`)."""
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("node_id", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field("document_id", tokenizer_name="raw", index_option="basic")
    builder.add_text_field("text", tokenizer_name=TOKENIZER, index_option="freq")
    return builder.build()


def build_analyzer(stemmer: str | None = "english", ascii_fold: bool = True):
    """The text analyzer of ``text`` (the arguments exist for the benchmark's variants)."""
    builder = (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(MAX_TOKEN_BYTES))
        .filter(tantivy.Filter.lowercase())
    )
    if ascii_fold:
        builder = builder.filter(tantivy.Filter.ascii_fold())
    if stemmer:
        builder = builder.filter(tantivy.Filter.stemmer(stemmer))
    return builder.build()


SCHEMA = build_schema()
ANALYZER = build_analyzer()


def register(index: tantivy.Index, analyzer=None) -> tantivy.Index:
    """Register :data:`TOKENIZER` on an opened or created ``index`` (needed before writing)."""
    index.register_tokenizer(TOKENIZER, analyzer or ANALYZER)
    return index


def hex_id(value: uuid.UUID | str) -> str:
    """The 32 hex characters a node or document id is indexed as."""
    return value.hex if isinstance(value, uuid.UUID) else uuid.UUID(str(value)).hex


def document(node_id, document_id, keyword_text: str) -> tantivy.Document:
    """The tantivy document of one node (``keyword_text``: already through ``keyword_text``)."""
    return tantivy.Document(
        node_id=hex_id(node_id), document_id=hex_id(document_id), text=keyword_text
    )


MIN_BOOST = 0.01


def idf_boost(total: int, matching: int) -> float:
    """FTS5's idf over Lucene's for a term in ``matching`` of ``total`` documents (1.0 when the
    term matches nothing), at least :data:`MIN_BOOST`. FTS5 (``fts5_aux.c``,
    ``fts5Bm25Function``): ``ln((N - n + 0.5) / (n + 0.5))``, which is 0 or less for a term in
    half the documents or more (FTS5 then uses 1e-6); tantivy (``bm25.rs``): ``ln(1 + (N - n +
    0.5) / (n + 0.5))``. The floor keeps such terms ranked by Lucene's idf, a hundredth of it,
    rather than all alike: in a space of a few documents every term is in half of them."""
    if matching <= 0 or total <= 0:
        return 1.0
    # Tantivy's doc_freq still counts deleted documents until their segment is merged, while
    # num_docs does not: after a replace the term can "match" more documents than are live.
    matching = min(matching, total)
    ratio = (total - matching + 0.5) / (matching + 0.5)
    return max(math.log(ratio) / math.log1p(ratio), MIN_BOOST)


def term_queries(
    terms: Iterable[str], searcher=None, analyzer=None, schema=None
) -> list[tantivy.Query]:
    """One query per distinct analyzed token of ``terms`` (the output of
    :func:`retrieval.text.keyword_terms`): a term query scored by BM25 (boosted by
    :func:`idf_boost` with ``searcher``'s statistics when one is given), or for a lone CJK
    character a regex query ``<char>.*`` over the CJK bigrams (the prefix rule of
    :func:`retrieval.text.is_lone_cjk`; matches score a constant)."""
    analyzer = analyzer or ANALYZER
    schema = schema or SCHEMA
    queries: list[tantivy.Query] = []
    seen: set[str] = set()
    for term in terms:
        if is_lone_cjk(term):
            if term + "*" not in seen:
                seen.add(term + "*")
                queries.append(tantivy.Query.regex_query(schema, "text", f"{term}.*"))
            continue
        for token in analyzer.analyze(term):
            if token not in seen:
                seen.add(token)
                clause = tantivy.Query.term_query(schema, "text", token)
                if searcher is not None:
                    boost = idf_boost(searcher.num_docs, searcher.doc_freq("text", token))
                    clause = tantivy.Query.boost_query(clause, boost)
                queries.append(clause)
    return queries


def build_query(
    query: str,
    *,
    language: str | None = None,
    documents: Iterable | None = None,
    searcher=None,
    analyzer=None,
    schema=None,
) -> tantivy.Query | None:
    """The tantivy query of a keyword-leg query, or ``None`` when nothing can match.

    The terms of :func:`retrieval.text.keyword_terms` (stop words dropped, CJK bigrams, at most
    64) become a disjunction of :func:`term_queries`; ``documents`` (``None``: all) adds a
    required term set on ``document_id``, so the top k counts allowed documents only;
    ``searcher`` (the one the query runs on) gives the idf boosts.
    """
    clauses = term_queries(keyword_terms(query, language), searcher, analyzer, schema)
    if not clauses:
        return None
    schema = schema or SCHEMA
    words = (
        clauses[0]
        if len(clauses) == 1
        else tantivy.Query.boolean_query([(tantivy.Occur.Should, q) for q in clauses])
    )
    if documents is None:
        return words
    allowed = sorted(hex_id(d) for d in documents)
    if not allowed:
        return None
    only = tantivy.Query.term_set_query(schema, "document_id", allowed)
    return tantivy.Query.boolean_query([(tantivy.Occur.Must, words), (tantivy.Occur.Must, only)])
