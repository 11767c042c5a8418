"""Text normalisation shared by every keyword index and query.

Latin text is left to the engine's analyzer (Snowball English stemming in SQLite's tantivy
keyword indexes, PostgreSQL's ``english`` configuration). Runs of CJK characters have no spaces
to split on, so they are indexed and queried as overlapping character bigrams (a lone character
stays a unigram), the approach of n-gram full-text parsers such as MySQL's ``ngram``.
"""

from __future__ import annotations

import re
import unicodedata


def is_blank(text: str) -> bool:
    """True when ``text`` shows nothing: only whitespace (``str.isspace``: spaces, tabs,
    newlines, no-break and ideographic spaces), control characters and invisible format
    characters (Unicode ``Cf``: zero-width space and joiners, word joiner, byte-order mark), which
    ``str.strip`` keeps. A query made of them has no term and no meaning: 400 ``invalid_query``.
    """
    return all(c.isspace() or unicodedata.category(c) in ("Cc", "Cf") for c in text)


_CJK = (
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uff66-\uff9f"  # Halfwidth Katakana (ｦ…ﾝ and the sound marks ﾞ ﾟ)
)
_CJK_RUN = re.compile(f"[{_CJK}]+")
_CJK_CHAR = re.compile(f"[{_CJK}]")
_WORD = re.compile(r"\w+", re.UNICODE)
MAX_QUERY_TERMS = 64

# Lucene's default English stop set (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET). Dropped from
# queries only (the index keeps every word, so BM25 statistics are unchanged): a query's "the"
# and "of" match nearly every chunk and add cost without adding ranking signal.
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their "
    "then there these they this to was will with".split()
)


def _bigrams(run: str) -> str:
    if len(run) == 1:
        return run
    return " ".join(run[i : i + 2] for i in range(len(run) - 1))


def keyword_text(text: str) -> str:
    """Return ``text`` as it is handed to the keyword index (CJK runs expanded to bigrams)."""
    return _CJK_RUN.sub(lambda m: f" {_bigrams(m.group())} ", text)


def is_cjk(char: str) -> bool:
    """Whether one character is in the CJK ranges indexed as bigrams (Han, kana including
    halfwidth Katakana U+FF66–U+FF9F, Hangul)."""
    return _CJK_CHAR.match(char) is not None


def is_lone_cjk(term: str) -> bool:
    """Whether a query term is a single CJK character. The index holds CJK text as bigrams, so
    such a term is searched as a prefix (``人`` matches the bigrams ``人口``, ``人民``…): every
    occurrence is found except one that ends a CJK run (its only bigram has it second)."""
    return len(term) == 1 and is_cjk(term)


def keyword_terms(query: str, language: str | None = None) -> list[str]:
    """Split a query into at most 64 distinct lower-case terms, CJK runs as bigrams.

    English stop words are dropped unless the query has nothing else (a query of only "to be or
    not to be" still searches for those words); CJK bigrams are never stop words. ``language``
    is the planner's (:func:`retrieval.planner.detect_language`): for ``cjk`` and
    ``mixed-cjk-latin`` queries the CJK terms come first, so the 64-term cap never drops them in
    favour of Latin words (a CJK query has no spaces: its bigrams are its only terms).
    """
    tokens: list[str] = []
    seen: set[str] = set()
    for token in _WORD.findall(keyword_text(query).lower()):
        if token not in seen:
            seen.add(token)
            tokens.append(token)
    content = [t for t in tokens if t not in STOP_WORDS] or tokens
    if language in ("cjk", "mixed-cjk-latin"):
        content = [t for t in content if is_cjk(t[0])] + [t for t in content if not is_cjk(t[0])]
    return content[:MAX_QUERY_TERMS]
