"""Ingestion services: document admission (``documents``) and compilation (``compilation``)."""
