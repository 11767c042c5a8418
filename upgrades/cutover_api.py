"""Re-exports for callers not yet moved (now :mod:`upgrades.api.cutover`)."""

from upgrades.api.cutover import (  # noqa: F401
    AdvanceSerializer,
    AdvanceView,
    LedgerView,
    RecutoverSerializer,
    RecutoverView,
    RollbackSerializer,
    RollbackView,
)
