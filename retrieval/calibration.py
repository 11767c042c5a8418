"""Calibrated fusion: scores that mean the same on every query, and exact matches first.

Min-max normalisation (:func:`retrieval.recall.fuse`) makes every leg's best candidate 1.0, so
the best hit of an off-topic query scores like a perfect match and a lone exact keyword hit ties
with a weak semantic one. The ``calibrated`` fusion (the default, :data:`DEFAULT_FUSION`) maps
each node's *raw* leg scores through fixed functions per embedding model, learned on SciFact's
train split by ``bench/calibrate_fusion.py`` (:data:`CALIBRATIONS`). Two separate parts:

- **The ranking** depends only on the per-leg combination
  ``f = α · cos + (1 − α) · log1p(bm25) / KEYWORD_REFERENCE + (boost / scale) · exact``:
  ``α`` and the exact boost by grids over train nDCG@10.
- **The displayed score** is a fixed monotone map of ``f``, ``p = σ(scale · (f − centre))``,
  computed as ``σ(bias + scale · f₀ + boost · exact)`` (``f₀`` the combination without the
  boost, ``bias = −scale · centre``): ``scale`` is the slope of a logistic regression of "the
  document is relevant" on ``f`` over every train candidate; ``centre`` is the train feature
  at which ``p = 0.5``, chosen so that a threshold of 0.5 keeps a stated share of the train
  relevant documents the first stage retrieves (the logistic's own intercept is not used: it
  is the probability at SciFact's base rate, under 1 relevant in 100 candidates, so a clear hit
  scored far below 0.5). The map
  changes no order; it only says what a threshold means.

- ``cos`` is the dense leg's cosine (-1..1), ``bm25`` the keyword leg's BM25 score. A node one
  leg did not return takes that leg's last score when the leg returned a full list (it ranked
  below it, so its score is at most that), else the leg's floor (0: no keyword match, or the
  dense leg saw every node). A leg that returned nothing (not run, or no query term in the
  space) gives nothing to weigh: the other leg's feature alone is ``f`` (the order is the same).
- ``exact`` (0..1) is the share of the query's exact targets the node's text holds: quoted
  phrases (``"…"`` or ``“…”``) and identifier-like tokens holding a digit (``EX-1234``,
  ``v2.3``, ``10.1038``), compared case-insensitively with word boundaries. A query without
  targets reads no text.

``p`` is in (0, 1) and does not depend on the other candidates, so a threshold on it means the
same on every query (case BC-35: a lone hit keeps its score, tied hits tie, an off-topic query's
best hit stays low). The parameters are keyed by the embedding model's id
(:data:`CALIBRATIONS`). A space on a model whose maps were not learned (a Dify model, MiniLM)
ranks by ``minmax`` under the ``calibrated`` fusion (:data:`LEARNED`, :func:`fuse_legs`).
"""

from __future__ import annotations

import functools
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

KEYWORD_REFERENCE = math.log1p(40.0)
#: The fusion of Fast, Deep and Research (``kfs eval --fusion`` compares the others): calibrated,
#: which beat min-max on SciFact test with the train fit (offline legs over whole abstracts,
#: first stage: nDCG@10 0.7443 against 0.7357, rrf 0.7234; docs/benchmarks.md).
DEFAULT_FUSION = "calibrated"
FUSION_NAMES = ("calibrated", "minmax", "rrf")


@dataclass(frozen=True)
class Calibration:
    """One embedding model's fusion parameters (module docstring)."""

    alpha: float  # the dense feature's share of the ranking score
    scale: float
    bias: float
    boost: float  # added to the logit for a node holding every exact target
    source: str = ""  # how it was learned (docs/benchmarks.md)


MINILM_ID = "local/all-MiniLM-L6-v2-int8-onnx"
BGE_SMALL_ID = "local/bge-small-en-v1.5-int8-onnx"

#: Per embedding model. bge-small-en-v1.5 int8 (the embedded default): learned on SciFact train
#: (809 claims, offline legs over whole abstracts, 100 candidates per leg) by
#: ``bench/calibrate_fusion.py --fit-only --depths 50,100 --keep-share 0.95``, 2026-12-03:
#: ranking ``α`` 0.8 (grid 0-1, train nDCG@10 0.7761; 50 per leg 0.7752), exact boost 0.05 in
#: feature units (the largest within 0.002 of the best train nDCG@10: 0 → 0.7761, 0.025 → 0.7766,
#: 0.05 → 0.7753, 0.1 → 0.7730), so ``boost`` = 0.05 · scale; output map: ``scale`` 37.9952 (the
#: train logistic's slope), ``centre`` 0.6711 (the 5th percentile of the relevant candidates'
#: feature: a threshold of 0.5 keeps 95 % of the train relevant documents the first stage
#: retrieves, and 39 % of the non-relevant candidates), ``bias`` = −scale · centre.
#: MiniLM-L6 (selectable): PROVISIONAL, set by hand (equal leg shares; σ = 0.5 at a cosine of
#: 0.75 alone or a strong keyword match with a moderate cosine), not learned.
CALIBRATIONS: dict[str, Calibration] = {
    MINILM_ID: Calibration(0.5, 8.0, -3.0, 3.0, "provisional, hand-set"),
    BGE_SMALL_ID: Calibration(0.8, 37.9952, -25.4986, 1.8998, "SciFact train, 2026-12-03"),
}
#: ``calibrated_fusion`` called without a model (the fitting script, unit tests) uses the
#: embedded default's parameters.
DEFAULT = CALIBRATIONS[BGE_SMALL_ID]
#: Models whose parameters were learned: the ``calibrated`` fusion of a space on any other model
#: (a Dify model, MiniLM with its provisional hand-set values) ranks by ``minmax`` instead,
#: because a cosine's scale is the model's own (bge-small's relevant cosines sit near 0.8,
#: MiniLM's near 0.5) and one model's fitted maps would misrank another's.
LEARNED = frozenset({BGE_SMALL_ID})


def calibration_for(model_id: str | None) -> Calibration:
    """The parameters of ``model_id``'s fusion (:data:`DEFAULT` for a model without its own)."""
    return CALIBRATIONS.get(model_id or "", DEFAULT)


# --- exact targets ------------------------------------------------------------------------------

_QUOTED = re.compile(r'"([^"]+)"|\u201c([^\u201d]+)\u201d')
_TOKEN_EDGE = "()[]{}<>,;:!?\"'\u201c\u201d\u2018\u2019."


def exact_targets(query: str) -> list[str]:
    """The query's exact targets, case-folded: quoted phrases (2+ characters), then tokens that
    hold a digit and another character (``EX-1234``; not a lone ``7``)."""
    targets: list[str] = []
    for match in _QUOTED.finditer(query):
        phrase = " ".join((match.group(1) or match.group(2) or "").split()).casefold()
        if len(phrase) >= 2 and phrase not in targets:
            targets.append(phrase)
    unquoted = _QUOTED.sub(" ", query)
    for raw in unquoted.split():
        token = raw.strip(_TOKEN_EDGE).casefold()
        if len(token) >= 2 and any(c.isdigit() for c in token) and token not in targets:
            targets.append(token)
    return targets


def _source(target: str) -> str:
    """``target`` as a whole-token pattern: its words joined by ``\\s+``, no word character on
    either side. The left edge is a lookbehind placed after the first word (the same test,
    ``(?<!\\w)word`` ≡ ``word(?<!\\wword)``) so the pattern starts with a literal, which ``re``
    finds by a fast scan instead of trying a lookbehind at every position."""
    words = [re.escape(w) for w in target.split()]
    return (
        words[0] + r"(?<!\w" + words[0] + ")" + "".join(r"\s+" + w for w in words[1:]) + (r"(?!\w)")
    )


@functools.lru_cache(maxsize=1024)
def _pattern(target: str) -> re.Pattern:
    return re.compile(_source(target), re.IGNORECASE)


@functools.lru_cache(maxsize=1024)
def _lowered_pattern(target: str) -> re.Pattern:
    """:func:`_pattern` without IGNORECASE, for a lower-case ASCII target in lowered text."""
    return re.compile(_source(target))


# The four non-ASCII letters Python's IGNORECASE matches to ASCII ones (``re`` documentation):
# without them in a text, an ASCII target matches it case-insensitively exactly when it
# matches the lowered text (every other letter lowers to a letter outside ASCII, or to itself).
# By the ASCII letter they fold onto: İ ı → i, ſ → s, K → k.
_FOLDS_OF = {"i": "\u0130\u0131", "s": "\u017f", "k": "\u212a"}
_FOLDS_TO_ASCII = re.compile("[" + "".join(_FOLDS_OF.values()) + "]")


def exact_share(targets: list[str], text: str) -> float:
    """The share of ``targets`` found in ``text`` (0 without targets). For an ASCII target in a
    text without :data:`_FOLDS_TO_ASCII` letters, a target with a word absent from the lowered
    text is skipped and the others are matched case-sensitively in the lowered text (the same
    answer; Python's IGNORECASE search is several times slower)."""
    if not targets:
        return 0.0
    lowered = text.lower() if text.isascii() or not _FOLDS_TO_ASCII.search(text) else None
    found = 0
    for target in targets:
        if lowered is not None and target.isascii():
            if all(word in lowered for word in target.split()):
                found += _lowered_pattern(target).search(lowered) is not None
            continue
        found += _pattern(target).search(text) is not None
    return found / len(targets)


# --- the fusion ---------------------------------------------------------------------------------


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _imputed(hits, depth: int | None, floor: float) -> float:
    """What a node absent from a leg scores: the leg's last score if the list was full."""
    if hits and depth is not None and len(hits) >= depth:
        return min(float(h.score) for h in hits)
    return floor


def calibrated_fusion(
    legs: dict,
    *,
    query: str = "",
    model_id: str | None = None,
    depth: int | None = None,
    texts: Callable[[list[uuid.UUID], list[str]], dict[uuid.UUID, str]] | None = None,
) -> list[tuple[uuid.UUID, float, dict]]:
    """Fuse ``legs`` (``{"dense"|"keyword": [ScoredNode]}``) into ``(node_id, p, per_leg)``,
    best first (ties by id). ``per_leg`` holds ``dense``/``keyword`` (each leg's calibrated
    feature, 0..1, for the nodes it found), ``dense_raw`` and ``keyword_raw`` (raw scores) and
    ``exact`` when the query has exact targets. ``depth`` is the legs' requested length (for
    the imputation); ``texts(ids, targets)`` returns the texts of the nodes among ``ids`` that
    may hold a target (needed only for exact targets; a node it leaves out scores share 0)."""
    cal = calibration_for(model_id)
    dense = {h.node_id: float(h.score) for h in legs.get("dense") or []}
    keyword = {h.node_id: float(h.score) for h in legs.get("keyword") or []}
    ids = list(dict.fromkeys([*dense, *keyword]))
    if not ids:
        return []
    targets = exact_targets(query) if query else []
    found = texts(ids, targets) if targets and texts is not None else {}
    dense_missing = _imputed(legs.get("dense"), depth, 0.0)
    keyword_missing = _imputed(legs.get("keyword"), depth, 0.0)
    # A leg that found nothing (not run, or no node matched: no query term in the space) gives
    # no evidence to weigh: the other leg's feature alone is the score (the order is the same).
    one_leg = not (dense and keyword)
    ranked = []
    for node_id in ids:
        cos = dense.get(node_id, dense_missing)
        bm25 = max(keyword.get(node_id, keyword_missing), 0.0)
        kw = math.log1p(bm25) / KEYWORD_REFERENCE
        if one_leg:
            feature = cos if dense else kw
        else:
            feature = cal.alpha * cos + (1.0 - cal.alpha) * kw
        per_leg: dict = {}
        if node_id in dense:
            per_leg["dense"] = round(max(min(cos, 1.0), 0.0), 6)
            per_leg["dense_raw"] = cos
        if node_id in keyword:
            per_leg["keyword"] = round(min(kw, 1.0), 6)
            per_leg["keyword_raw"] = keyword[node_id]
        share = 0.0
        if targets:
            text = found.get(node_id)
            share = exact_share(targets, text) if text else 0.0
            per_leg["exact"] = share
        score = _sigmoid(cal.bias + cal.scale * feature + cal.boost * share)
        ranked.append((node_id, score, per_leg))
    ranked.sort(key=lambda r: (-r[1], r[0]))  # ties by id: UUIDs order as their text does
    return ranked


def effective_fusion(fusion: str, snapshot) -> str:
    """The fusion that ranks ``snapshot``'s space under ``fusion``: ``calibrated`` on a space
    whose model has no learned maps (not in :data:`LEARNED`), or no index yet, is ``minmax``."""
    if fusion != "calibrated":
        return fusion
    model_id = snapshot.version[1] if snapshot.version is not None else None
    return "calibrated" if model_id in LEARNED else "minmax"


def fuse_legs(fusion: str, results: dict, query: str, snapshot, depth: int) -> list:
    """The fused candidates of ``results`` by ``fusion`` (``calibrated``, ``minmax``, ``rrf``);
    ``calibrated`` on a space whose model has no learned maps (not in :data:`LEARNED`) is
    ``minmax``."""
    if not results:
        return []
    fusion = effective_fusion(fusion, snapshot)
    if fusion == "calibrated":
        return calibrated_fusion(
            results, query=query, model_id=snapshot.version[1], depth=depth, texts=node_texts
        )
    from .recall import FUSIONS

    return FUSIONS[fusion](results)


#: Most target words :func:`node_texts` turns into ``LIKE`` conditions (a query of the allowed
#: length may hold thousands; SQLite refuses an expression tree deeper than 1,000): past it,
#: every text is read, as for a non-ASCII target.
PREFILTER_MAX_WORDS = 256


def node_texts(ids, targets: list[str]) -> dict:
    """``{node_id: text}`` of the nodes among ``ids`` that may hold one of ``targets`` (one
    statement; the exact boost needs no citations). With ASCII targets the database keeps only
    the texts holding every word of a target as a substring in any ASCII case (``LIKE``, so the
    other texts are never read into Python; :func:`exact_share` finds no other: its
    case-insensitive match of an ASCII word is ASCII, apart from the four non-ASCII letters
    Unicode folds onto ASCII ones, K ſ İ ı: a text holding one that a target's letter matches
    is kept too); otherwise (or past :data:`PREFILTER_MAX_WORDS` words) every text."""
    from django.db import connection

    from ingestion.models import KnowledgeNode

    from .recall import as_uuid, ids_condition

    ids = list(ids)
    if not ids:
        return {}
    where, param = ids_condition("id", ids)
    params: list = [param]
    groups_of_words = [target.split() for target in targets]
    if sum(map(len, groups_of_words)) <= PREFILTER_MAX_WORDS and all(
        target.isascii() for target in targets
    ):
        # SQLite's LIKE ignores ASCII case itself; elsewhere the text is lowered first, on
        # PostgreSQL under the "C" collation (ASCII only: a Turkish LC_CTYPE lowers I to ı).
        like = {"sqlite": "text LIKE %s", "postgresql": 'LOWER(text COLLATE "C") LIKE %s'}.get(
            connection.vendor, "LOWER(text) LIKE %s"
        )
        groups = []
        for words in groups_of_words:
            groups.append(" AND ".join([f"{like} ESCAPE '!'"] * len(words)))
            params.extend(f"%{_like_escaped(word)}%" for word in words)
        # A text holding one of the four letters that fold onto a target's i, s or k may match
        # where LIKE cannot tell (the text itself, not lowered: LOWER may change them).
        folds = sorted({f for t in targets for a, fs in _FOLDS_OF.items() if a in t for f in fs})
        groups.extend(["text LIKE %s"] * len(folds))
        params.extend(f"%{f}%" for f in folds)
        where += " AND ((" + ") OR (".join(groups) + "))"
    table = connection.ops.quote_name(KnowledgeNode._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, text FROM {table} WHERE {where}", params)
        return {as_uuid(row[0]): row[1] for row in cursor.fetchall()}


def _like_escaped(word: str) -> str:
    """``word`` as a literal in a ``LIKE … ESCAPE '!'`` pattern."""
    return word.replace("!", "!!").replace("%", "!%").replace("_", "!_")
