from django.apps import AppConfig


class SpacesConfig(AppConfig):
    """Knowledge spaces, their publication heads and the API keys that reach them."""

    name = "spaces"
    verbose_name = "Knowledge spaces"
