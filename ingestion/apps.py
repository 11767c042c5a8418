from django.apps import AppConfig


class IngestionConfig(AppConfig):
    """Documents and their durable compilation: parse → chunk → embed → index → publish."""

    name = "ingestion"
    verbose_name = "Ingestion"

    def ready(self) -> None:
        from knowledgefs.jobs import schedules
        from spaces import signals
        from spaces.models import KnowledgeSpace

        from . import receivers
        from .compilation import dispatch

        # A space being deleted loses its documents (spaces.services.delete_space).
        signals.space_emptying.connect(
            receivers.purge_space_documents,
            sender=KnowledgeSpace,
            dispatch_uid="ingestion.purge_space_documents",
        )
        # The compilation recovery sweep's django-q2 schedule (kfs schedules).
        schedules.register(dispatch.RECOVERY)
        # Source runs: their recovery sweep, and the due syncs of sync policies.
        from .sources import dispatch as source_runs

        schedules.register(source_runs.SWEEP)
        schedules.register(source_runs.DUE)
        # The daily report of unreferenced stored objects: a dry run, it never deletes
        # (`kfs storage sweep --apply` does; docs/operations.md, "Unreferenced objects").
        schedules.register(
            schedules.Schedule(
                "kfs-storage-sweep-report", "ingestion.tasks.report_unreferenced_objects", 1440
            )
        )
