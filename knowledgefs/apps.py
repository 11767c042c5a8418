import logging

from django.apps import AppConfig
from django.db.models.signals import pre_migrate


class KnowledgeFSConfig(AppConfig):
    """Project package: the Dify boundary (model runtime, storage), errors, health, the kfs CLI,
    and the guarded downgrades (``knowledgefs.downgrades``)."""

    name = "knowledgefs"
    verbose_name = "KnowledgeFS"

    def ready(self) -> None:
        from knowledgefs import checks  # noqa: F401  (registers the system checks)
        from knowledgefs.downgrades import refuse_guarded_plan

        pre_migrate.connect(refuse_guarded_plan, dispatch_uid="knowledgefs.guarded_downgrades")
        # Every process (gunicorn runs no system checks) names the retired selectors once.
        for warning in checks.ignored_selector_warnings():
            logging.getLogger("knowledgefs.settings").warning("%s (%s)", warning.msg, warning.id)
