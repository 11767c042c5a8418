"""Models of the classic Dataset upgrade bridge.

``jobs``: the upgrade job of one Dataset, its documents and the file leases that keep legacy bytes
alive. ``cutover``: the per-workspace cutover ledger and the cleanup authorizations.
"""

from .cutover import (
    CUT_OVER_PHASES,
    SWITCHES,
    CleanupAuthorization,
    CleanupStatus,
    CutoverPhase,
    WorkspaceCutoverLedger,
)
from .jobs import (
    ACTIVE_JOB_STATUSES,
    DocumentStatus,
    FileLeaseStatus,
    JobStage,
    JobStatus,
    UpgradeDocument,
    UpgradeFileLease,
    UpgradeJob,
)

__all__ = [
    "ACTIVE_JOB_STATUSES",
    "CUT_OVER_PHASES",
    "CleanupAuthorization",
    "CleanupStatus",
    "CutoverPhase",
    "DocumentStatus",
    "FileLeaseStatus",
    "JobStage",
    "JobStatus",
    "SWITCHES",
    "UpgradeDocument",
    "UpgradeFileLease",
    "UpgradeJob",
    "WorkspaceCutoverLedger",
]
