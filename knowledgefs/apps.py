from django.apps import AppConfig


class KnowledgeFSConfig(AppConfig):
    """Project package: the Dify boundary (model runtime, storage), errors, health, the kfs CLI."""

    name = "knowledgefs"
    verbose_name = "KnowledgeFS"

    def ready(self) -> None:
        from knowledgefs import checks  # noqa: F401  (registers the system checks)
