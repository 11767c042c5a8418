from django.apps import AppConfig


class SpacesConfig(AppConfig):
    """Knowledge spaces, their publication heads and the API keys that reach them."""

    name = "spaces"
    verbose_name = "Knowledge spaces"

    def ready(self) -> None:
        from django.db.models.signals import post_save, pre_delete

        from knowledgefs import runtime

        from . import receivers
        from .models import KnowledgeSpace
        from .profiles import embedding_model

        # Vector space ids (a Dify embedding profile's index model) are served for their space.
        runtime.register_space_models(embedding_model)
        post_save.connect(
            receivers.space_profile, sender=KnowledgeSpace, dispatch_uid="spaces.space_profile"
        )
        pre_delete.connect(
            receivers.keys_never_widen,
            sender=KnowledgeSpace,
            dispatch_uid="spaces.keys_never_widen",
        )
