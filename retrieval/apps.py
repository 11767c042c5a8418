from django.apps import AppConfig


class RetrievalConfig(AppConfig):
    """Search backends (keyword + dense), Fast retrieval and evaluation."""

    name = "retrieval"
    verbose_name = "Retrieval"

    def ready(self) -> None:
        from ingestion.projection import register
        from retrieval import checks  # noqa: F401  (registers the system checks)
        from retrieval.projector import SearchProjector

        register(SearchProjector())
