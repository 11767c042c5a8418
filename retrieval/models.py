"""Index projections kept by the portable part of the search backend.

The keyword projection is engine-specific (an FTS5 table on SQLite, a tsvector table on
PostgreSQL) and is created by this app's migrations, not declared as a model.
"""

from __future__ import annotations

from django.db import models

from ingestion.models import KnowledgeNode
from spaces.models import KnowledgeSpace


class DenseVector(models.Model):
    """The dense-vector projection of one node: float32 little-endian bytes of ``dimension``."""

    node = models.OneToOneField(
        KnowledgeNode, on_delete=models.CASCADE, primary_key=True, related_name="dense_vector"
    )
    space = models.ForeignKey(KnowledgeSpace, on_delete=models.CASCADE, related_name="+")
    model_id = models.CharField(max_length=200)
    dimension = models.PositiveIntegerField()
    vector = models.BinaryField()

    class Meta:
        indexes = [models.Index(fields=["space", "model_id"], name="dense_space_model")]
