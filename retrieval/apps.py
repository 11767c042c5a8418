from django.apps import AppConfig


class RetrievalConfig(AppConfig):
    """Search backends (keyword + dense), Fast retrieval and evaluation."""

    name = "retrieval"
    verbose_name = "Retrieval"

    def ready(self) -> None:
        from knowledgefs.jobs import schedules
        from retrieval import checks  # noqa: F401  (registers the system checks)
        from retrieval.research_tasks import dispatch
        from spaces import signals
        from spaces.models import KnowledgeSpace

        from . import receivers

        # A space whose embedding profile became usable gets its active index version.
        signals.embedding_profile_ready.connect(
            receivers.index_ready_profile,
            sender=KnowledgeSpace,
            dispatch_uid="retrieval.index_ready_profile",
        )
        schedules.register(dispatch.SWEEP)
