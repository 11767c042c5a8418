"""Re-exports for callers not yet moved."""

from spaces.api.serializers import (  # noqa: F401
    KnowledgeSpaceSerializer,
    SpaceCreateSerializer,
    SpaceUpdateSerializer,
)
