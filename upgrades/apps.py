from django.apps import AppConfig


class UpgradesConfig(AppConfig):
    """The bridge that upgrades Dify's classic Datasets into knowledge spaces."""

    name = "upgrades"
    verbose_name = "Dataset upgrades"

    def ready(self) -> None:
        from knowledgefs.auth import gates
        from knowledgefs.jobs import schedules
        from spaces import readiness, signals
        from spaces.models import KnowledgeSpace

        from . import receivers
        from .services import dispatch, reconciliation_runner
        from .services.cutover import cutover_gate
        from .services.reconciliation_gate import servable_gate

        # A tenant moving off classic Datasets reaches product routes only while its cutover
        # gate is open; a space that is an unreconciled upgrade target does not serve retrieval.
        gates.register("workspace_cutover", cutover_gate)
        readiness.register_gate("upgrade_reconciliation", servable_gate)
        # A space is not deleted under a running upgrade; finished upgrades outlive it.
        signals.space_deletion_requested.connect(
            receivers.refuse_while_upgrading,
            sender=KnowledgeSpace,
            dispatch_uid="upgrades.refuse_space_deletion",
        )
        signals.space_deleting.connect(
            receivers.detach_finished_upgrades,
            sender=KnowledgeSpace,
            dispatch_uid="upgrades.detach_finished_upgrades",
        )
        # The staged run's django-q2 schedules (kfs schedules, kfs upgrade schedules).
        schedules.register(reconciliation_runner.RECOVERY)
        schedules.register(dispatch.SWEEP)
