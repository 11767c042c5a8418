from django.apps import AppConfig


class UpgradesConfig(AppConfig):
    """The bridge that upgrades Dify's classic Datasets into knowledge spaces."""

    name = "upgrades"
    verbose_name = "Dataset upgrades"

    def ready(self) -> None:
        from knowledgefs.auth import gates
        from knowledgefs.jobs import schedules
        from spaces import readiness

        from .services import dispatch, reconciliation
        from .services.cutover import cutover_gate
        from .services.reconciliation import servable_gate

        # A tenant moving off classic Datasets reaches product routes only while its cutover
        # gate is open; a space that is an unreconciled upgrade target does not serve retrieval.
        gates.register("workspace_cutover", cutover_gate)
        readiness.register_gate("upgrade_reconciliation", servable_gate)
        # The staged run's django-q2 schedules (kfs schedules, kfs upgrade schedules).
        schedules.register(reconciliation.RECOVERY)
        schedules.register(dispatch.SWEEP)
