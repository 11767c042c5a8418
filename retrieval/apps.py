from django.apps import AppConfig
from threadpoolctl import threadpool_limits


class RetrievalConfig(AppConfig):
    """Search backends (keyword + dense), Fast retrieval and evaluation."""

    name = "retrieval"
    verbose_name = "Retrieval"

    def ready(self) -> None:
        from ingestion.projection import register
        from knowledgefs.jobs import schedules
        from retrieval import checks  # noqa: F401  (registers the system checks)
        from retrieval.quality import replay_dispatch, triage_dispatch
        from retrieval.research_tasks import dispatch
        from spaces import signals
        from spaces.models import KnowledgeSpace

        from . import receivers
        from .projector import SearchProjector

        # A space whose embedding profile became usable gets its active index version.
        signals.embedding_profile_ready.connect(
            receivers.index_ready_profile,
            sender=KnowledgeSpace,
            dispatch_uid="retrieval.index_ready_profile",
        )
        # An emptied or deleted space loses its keyword index folder (SQLite).
        for signal, uid in (
            (signals.space_emptying, "retrieval.remove_keyword_index.emptying"),
            (signals.space_deleting, "retrieval.remove_keyword_index.deleting"),
        ):
            signal.connect(receivers.remove_keyword_index, sender=KnowledgeSpace, dispatch_uid=uid)
        schedules.register(dispatch.SWEEP)
        schedules.register(replay_dispatch.SWEEP)
        schedules.register(triage_dispatch.SWEEP)
        # Compilation and document deletion reach the search backends through this port.
        register(SearchProjector())
        # The exact dense leg is one memory-bound matrix-vector product per query: a second
        # BLAS thread only contends with the request threads and the other processes (at 10k
        # rows 0.2 ms on one thread against 4.6 ms on two under load; docs/benchmarks.md).
        threadpool_limits(limits=1, user_api="blas")
