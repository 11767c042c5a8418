"""The MySQL/MariaDB driver for Django's ``mysql`` backend.

Django's backend imports the ``MySQLdb`` module (mysqlclient). mysqlclient is GPL-2.0, which our
dependency rule excludes, so KnowledgeFS ships PyMySQL (MIT) and installs it under the name
``MySQLdb``; an operator who installed mysqlclient on purpose keeps it.
"""

from __future__ import annotations

import importlib.util

# Django 5.2's backend refuses a MySQLdb older than this (django/db/backends/mysql/base.py).
DJANGO_MINIMUM_MYSQLDB = (1, 4, 3)


def install_driver() -> str:
    """Make ``import MySQLdb`` work; returns ``"mysqlclient"`` or ``"pymysql"``.

    PyMySQL's ``install_as_MySQLdb()`` registers it as ``MySQLdb``; its ``version_info`` is the
    mysqlclient-compatible (1, 4, 6), which passes Django's check as it is, so nothing is
    faked. Raises ``ImproperlyConfigured`` when neither driver is installed.
    """
    from django.core.exceptions import ImproperlyConfigured

    if importlib.util.find_spec("MySQLdb") is not None:
        return "mysqlclient"
    try:
        import pymysql
    except ImportError:
        raise ImproperlyConfigured(
            "DATABASE_URL names MySQL/MariaDB but no driver is installed: pip install PyMySQL"
        ) from None
    if tuple(pymysql.version_info[:3]) < DJANGO_MINIMUM_MYSQLDB:
        raise ImproperlyConfigured(
            f"PyMySQL {pymysql.__version__} reports MySQLdb version {pymysql.version_info[:3]}; "
            f"Django needs at least {DJANGO_MINIMUM_MYSQLDB}: upgrade PyMySQL"
        )
    pymysql.install_as_MySQLdb()
    return "pymysql"


# Each conditional unique constraint of the models (a partial unique index on SQLite and
# PostgreSQL, which Django skips on MySQL/MariaDB) → (table, the unique index over a stored
# generated column that enforces the same rule on MySQL/MariaDB, and the migration adding it).
# tests/system/test_migrations_engines.py checks that every conditional unique constraint is listed
# and, on MySQL/MariaDB, that each index exists.
MYSQL_UNIQUE_COUNTERPARTS = {
    "upgrade_job_active_dataset_uq": (
        "upgrade_job",
        "upgrade_job_active_dataset_gen_uq",
        "upgrades.0001_upgrade_jobs",
    ),
    "one_live_job_per_document": (
        "ingestion_compilationjob",
        "one_live_job_per_document_gen",
        "ingestion.0006_mysql_one_live_job_per_document",
    ),
    "one_active_index_version": (
        "retrieval_indexversion",
        "one_active_index_version_gen",
        "retrieval.0004_mysql_one_index_version_per_state",
    ),
    "one_building_index_version": (
        "retrieval_indexversion",
        "one_building_index_version_gen",
        "retrieval.0004_mysql_one_index_version_per_state",
    ),
}

# The columns those counterparts add outside the model state (raw generated columns), by table;
# the upgrade job's generated column is a model field (GeneratedField) and is not listed.
MYSQL_EXTRA_COLUMNS = {
    "ingestion_compilationjob": {"live_document_id"},
    "retrieval_indexversion": {"active_space_id", "building_space_id"},
}

# System checks that only say "MySQL/MariaDB lacks this": conditional unique constraints
# (models.W036; each has its counterpart above), conditional indexes (models.W037; performance
# only: the index is skipped, queries stay correct) and unique CharFields over 255 characters
# (mysql.W003; with utf8mb4 and InnoDB's DYNAMIC rows an index key holds 3,072 bytes, so the
# 300-character ``storage_key`` fits).
MYSQL_SILENCED_CHECKS = ["models.W036", "models.W037", "mysql.W003"]
