from django.apps import AppConfig


class UpgradesConfig(AppConfig):
    """The bridge that upgrades Dify's classic Datasets into knowledge spaces."""

    name = "upgrades"
    verbose_name = "Dataset upgrades"
