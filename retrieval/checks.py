"""System checks of the retrieval app (registered by :class:`retrieval.apps.RetrievalConfig`)."""

from __future__ import annotations

from django.core.checks import Error, Tags, register
from django.db import DatabaseError, connections


@register(Tags.database)
def check_pgvector_available(app_configs=None, databases=None, **kwargs) -> list[Error]:
    """``retrieval.E001``: a PostgreSQL database must offer pgvector ≥ 0.8 (the dense leg's
    ``vector`` column and HNSW indexes, migration ``retrieval.0008``).

    A database check: Django runs it for ``migrate`` and ``check --database``, so a server
    without the extension is named before the migration fails on it. Other engines pass.
    """
    from retrieval.backends.pgvector import availability_problem

    errors = []
    for alias in databases or ():
        connection = connections[alias]
        if connection.vendor != "postgresql":
            continue
        try:
            problem = availability_problem(connection)
        except DatabaseError as exc:  # the database check of `migrate` reports the connection
            problem = f"could not read pg_available_extensions: {exc}".splitlines()[0]
        if problem is not None:
            errors.append(
                Error(
                    f"database {alias!r}: {problem}",
                    hint="docs/configuration.md, 'PostgreSQL and pgvector'",
                    id="retrieval.E001",
                )
            )
    return errors
