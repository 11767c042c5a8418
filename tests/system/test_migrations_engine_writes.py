"""Writes on every engine (run on SQLite and PostgreSQL by the suite and on MariaDB by
``make test-mariadb``, which runs every ``tests/system/test_migrations*.py``): on MySQL/MariaDB,
the schema-only engine, an upload and ``kfs ingest`` are refused with 503
``search_backend_unavailable`` before anything is written, and nothing logs a traceback
or an ERROR besides Django's one-line 5xx record; on the
other engines the same upload is accepted."""

from __future__ import annotations

import logging

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from ingestion.models import CompilationJob, Document
from knowledgefs.testing.fixtures import upload

pytestmark = pytest.mark.django_db


def test_an_upload_on_mysql_is_a_503_before_anything_is_written(client, space, caplog):
    caplog.set_level(logging.DEBUG)
    response = upload(client, space, "notes.txt", b"coral reefs and sea grass")
    # Django's request logger reports every 5xx response at ERROR (one line, no traceback);
    # anything else at ERROR, or any traceback, is a failure inside the request.
    errors = [
        r
        for r in caplog.records
        if r.exc_info or (r.levelno >= logging.ERROR and r.name != "django.request")
    ]
    if connection.vendor == "mysql":
        assert response.status_code == 503, response.content
        body = response.json()
        assert (body["code"], body["details"]) == (
            "search_backend_unavailable",
            {"vendor": "mysql"},
        )
        assert "MySQL/MariaDB is supported for the schema" in body["message"]
        assert not Document.objects.exists() and not CompilationJob.objects.exists()
    else:
        assert response.status_code == 202, response.content
        assert Document.objects.count() == 1
    assert errors == [], [r.getMessage() for r in errors]


def test_kfs_ingest_on_mysql_is_refused_before_anything_is_written(space, tmp_path):
    (tmp_path / "a.txt").write_text("coral reefs")
    args = ["ingest", str(tmp_path), "--space", space.slug, "--tenant", space.tenant_id, "--json"]
    if connection.vendor == "mysql":
        with pytest.raises(CommandError, match="search_backend_unavailable"):
            call_command("kfs", *args)
        assert not Document.objects.exists()
    else:
        call_command("kfs", *args)
        assert Document.objects.count() == 1
