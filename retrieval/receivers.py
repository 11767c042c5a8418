"""Retrieval's receivers of the spaces app's signals, connected in ``RetrievalConfig.ready()``."""

from __future__ import annotations

from spaces.models import KnowledgeSpace

from .index_versions import ensure_active_version


def index_ready_profile(sender, space: KnowledgeSpace, **kwargs) -> None:
    """A space whose embedding profile became usable (``spaces.signals.embedding_profile_ready``)
    has its active index version: created now if it has none (:func:`ensure_active_version`,
    in the sender's transaction, under the space's row lock), else left as it is."""
    ensure_active_version(space)
