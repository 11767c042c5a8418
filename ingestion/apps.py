from django.apps import AppConfig


class IngestionConfig(AppConfig):
    """Documents and their durable compilation: parse → chunk → embed → index → publish."""

    name = "ingestion"
    verbose_name = "Ingestion"
