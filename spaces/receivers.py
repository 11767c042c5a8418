"""The spaces app's own model receivers, connected in ``SpacesConfig.ready()``.

A new space gets its profile row in the transaction that creates it; a space about to be
deleted (by whatever path) first loses the keys bound only to it.
"""

from __future__ import annotations

from .api_keys import delete_keys_scoped_only_to
from .models import KnowledgeSpace
from .profiles import create_profile


def space_profile(sender, instance: KnowledgeSpace, created: bool, raw: bool = False, **kwargs):
    """Every new space gets its profile row in the transaction that creates it: the local
    profile, ``ready``, under ``KNOWLEDGE_MODEL_RUNTIME=local``; ``setup-required`` otherwise."""
    if created and not raw:
        create_profile(instance)


def keys_never_widen(sender, instance: KnowledgeSpace, **kwargs) -> None:
    """Whatever deletes a space (``delete_space``, a cascade, the shell), the keys bound only to
    it go first: once their binding cascaded away they would reach the whole tenant. Runs inside
    the deletion's transaction."""
    delete_keys_scoped_only_to(instance)
