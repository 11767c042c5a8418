"""Ingestion compilation (``compilation``), plus re-exports for callers not yet moved
(``documents``, ``availability``, ``reports`` now live in ``ingestion/``)."""
