"""Models of the classic Dataset upgrade bridge.

``jobs``: the upgrade job of one Dataset, its documents and the file leases that keep legacy bytes
alive. ``cutover``: the per-workspace cutover ledger and the cleanup authorizations.
"""

from .cutover import (  # noqa: F401
    CUT_OVER_PHASES,
    SWITCHES,
    CleanupAuthorization,
    CleanupStatus,
    CutoverPhase,
    WorkspaceCutoverLedger,
)
from .jobs import (  # noqa: F401
    ACTIVE_JOB_STATUSES,
    DocumentStatus,
    FileLeaseStatus,
    JobStage,
    JobStatus,
    UpgradeDocument,
    UpgradeFileLease,
    UpgradeJob,
)
