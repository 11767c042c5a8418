"""Re-exports for callers not yet moved (the code lives in :mod:`ingestion.compilation`)."""

from ingestion.compilation.dispatch import (  # noqa: F401
    RECOVERY_SCHEDULE,
    TASK_FUNCTION,
    dispatch,
    enqueue_on_commit,
    ensure_recovery_schedule,
)
from ingestion.compilation.embed_step import _embedding_lengths  # noqa: F401
from ingestion.compilation.errors import LeaseLost  # noqa: F401
from ingestion.compilation.failures import fail  # noqa: F401
from ingestion.compilation.generations import _NODE_NAMESPACE  # noqa: F401
from ingestion.compilation.leases import (  # noqa: F401
    Held,
    _checkpoint,
    _checkpoint_many,
    claim,
    claim_many,
    heartbeat,
    lease_seconds,
)
from ingestion.compilation.operations import (  # noqa: F401
    cancel_job,
    retry_job,
    supersede_live_jobs,
)
from ingestion.compilation.parse_step import RETRYABLE_PARSE_CODES, _parse  # noqa: F401
from ingestion.compilation.pipeline import (  # noqa: F401
    _chunk_wave,
    _compile_claimed,
    compile_jobs,
    run_job,
)
from ingestion.compilation.progress import _progress  # noqa: F401
from ingestion.compilation.publish import publish, publish_many  # noqa: F401
from ingestion.compilation.recovery import (  # noqa: F401
    _timeout_recorded,
    drain_queued,
    recover_jobs,
)
from ingestion.compilation.waves import _retain  # noqa: F401
