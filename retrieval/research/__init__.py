"""Research mode (the contract is :mod:`retrieval.research.run`): the names callers use."""

from .budget import (  # noqa: F401
    DURABLE,
    INTERACTIVE,
    MIN_CALL_SECONDS,
    ROUNDS_KEY,
    SPENT_KEY,
    STEPS,
    Policy,
    ResearchCanceled,
)
from .decompose import decompose  # noqa: F401
from .pooling import Ranked, shared_pool, weighted_max  # noqa: F401
from .rounds import (  # noqa: F401
    COMBINATION,
    JUDGE_MAX_ITEM_CHARS,
    JUDGE_MAX_ITEMS,
    MAX_POOL,
    ORIGINAL_WEIGHT,
    PLANNED_WEIGHT,
    PLANNER_VERSION,
)
from .run import run_research  # noqa: F401
