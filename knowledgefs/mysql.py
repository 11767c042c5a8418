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
