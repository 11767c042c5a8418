"""System checks of the retrieval app (registered by :class:`retrieval.apps.RetrievalConfig`)."""

from __future__ import annotations

from django.core.checks import Error, Tags, Warning, register
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


@register(Tags.database)
def check_keyword_indexes(app_configs=None, databases=None, **kwargs) -> list[Warning]:
    """``retrieval.W002``: on SQLite (database backend), every space's keyword index is usable
    (:func:`retrieval.keyword_index.maintenance.problems`: missing while the space has
    published nodes, unreadable ``meta.json``, an open error).

    A database check: ``migrate`` and ``check --database default`` print it at start-up. A
    warning, not an error, so ``migrate`` still runs (its ``retrieval.0009`` builds the
    indexes); a database before ``retrieval.0009`` (the FTS5 table still there) or not
    migrated yet passes."""
    from retrieval.backends import backend_name

    if "default" not in (databases or ()) or backend_name() != "database":
        return []
    connection = connections["default"]
    if connection.vendor != "sqlite":
        return []
    from retrieval.keyword_index import maintenance

    try:
        if "retrieval_keyword_fts" in connection.introspection.table_names():
            return []  # retrieval.0009 not applied: the FTS5 table still serves
        problems = maintenance.problems()
    except DatabaseError:  # tables not created yet
        return []
    return [
        Warning(
            f"keyword index of space {space_id}: {problem}",
            hint=f"rebuild it: python manage.py kfs reindex --space {space_id}",
            id="retrieval.W002",
        )
        for space_id, problem in problems.items()
    ]
