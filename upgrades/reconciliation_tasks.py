"""Re-exports of upgrades.tasks at the dotted path stored in queued messages and schedule rows."""

from upgrades.tasks import reconcile_documents, recover_reconciliations  # noqa: F401
