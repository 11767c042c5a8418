"""Retrieval's receivers of the spaces app's signals, connected in ``RetrievalConfig.ready()``."""

from __future__ import annotations

from spaces.models import KnowledgeSpace

from .index_versions import ensure_active_version


def index_ready_profile(sender, space: KnowledgeSpace, **kwargs) -> None:
    """A space whose embedding profile became usable (``spaces.signals.embedding_profile_ready``)
    has its active index version: created now if it has none (:func:`ensure_active_version`,
    in the sender's transaction, under the space's row lock), else left as it is."""
    ensure_active_version(space)


def remove_keyword_index(sender, space: KnowledgeSpace, **kwargs) -> None:
    """A space emptied or deleted (``spaces.signals.space_emptying`` after ingestion purged its
    documents, ``space_deleting``) loses its keyword index folder once the sender's transaction
    commits (at once outside one). Only SQLite's database backend keeps such folders."""
    from django.db import connection, transaction

    from .backends import backend_name

    if connection.vendor != "sqlite" or backend_name() != "database":
        return
    from .keyword_index import store

    space_id = space.id
    transaction.on_commit(lambda: store.remove(space_id))
