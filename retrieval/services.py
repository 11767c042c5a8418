"""Re-exports for callers not yet moved."""

from .fast_deep import DEEP_EXPANSION_FACTOR  # noqa: F401
from .modes import PROFILE, retrieve  # noqa: F401
from .planner import FUSION_MULTIPLIER, RECALL_MULTIPLIER  # noqa: F401
from .recall import (  # noqa: F401
    CONCRETE_MODES,
    LEGS,
    MIN_LEG_CANDIDATES,
    MODES,
    RetrievalItem,
    RetrievalResult,
    fuse,
    min_max,
    reciprocal_rank_fusion,
    resolve_snapshot,
    validate_request,
    validate_top_k,
)
