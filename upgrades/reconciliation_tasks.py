"""The dotted path that stored django-q2 rows and messages name: queued reconciliation messages
and the recovery schedule row (migration ``upgrades.0005``) call
``upgrades.reconciliation_tasks.<fn>`` (``TASK_FUNCTION``, ``RECOVERY_FUNCTION``), so this module
stays and re-exports those entry points of :mod:`upgrades.tasks`."""

from upgrades.tasks import reconcile_documents, recover_reconciliations  # noqa: F401
