from django.apps import AppConfig


class RetrievalConfig(AppConfig):
    """Search backends (keyword + dense), Fast retrieval and evaluation."""

    name = "retrieval"
    verbose_name = "Retrieval"
