from django.apps import AppConfig


class SpacesConfig(AppConfig):
    """Knowledge spaces, their publication heads and the API keys that reach them."""

    name = "spaces"
    verbose_name = "Knowledge spaces"

    def ready(self) -> None:
        from knowledgefs import runtime

        from .profiles import embedding_model

        # Vector space ids (a Dify embedding profile's index model) are served for their space.
        runtime.register_space_models(embedding_model)
