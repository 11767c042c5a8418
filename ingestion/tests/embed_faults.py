"""Test helper: a fault in resolving the embedding targets as the embed step sees it.

The compiler also resolves the targets before chunking (their windows bound the chunks), so a
test of the embed step's own failure handling replaces them only where the embed step looks.
"""

from ingestion.compilation import embed_step
from ingestion.projection import projector


class _Projector:
    """The real projector, except for ``targets``."""

    def __init__(self, targets) -> None:
        self.targets = targets

    def __getattr__(self, name):
        return getattr(projector(), name)


def fail_embed_targets(monkeypatch, targets) -> None:
    """Make the embed step call ``targets(space_id)`` instead of the projector's."""
    monkeypatch.setattr(embed_step, "projector", lambda: _Projector(targets))
