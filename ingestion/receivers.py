"""Ingestion's receivers of the spaces app's signals, connected in ``IngestionConfig.ready()``."""

from __future__ import annotations

from spaces.models import KnowledgeSpace

from .documents import purge_documents


def purge_space_documents(sender, space: KnowledgeSpace, **kwargs) -> None:
    """A space being deleted loses its documents (``spaces.signals.space_emptying``): each is
    purged in its own transaction, or in the caller's when sent under the space's row lock."""
    purge_documents(space.documents.all())
