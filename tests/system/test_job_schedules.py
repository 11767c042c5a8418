"""The schedules registry (knowledgefs/jobs/schedules.py): each app's django-q2 schedule is
registered once by its AppConfig and repaired by name into the same row the migration made."""

from __future__ import annotations

import pytest
from django_q.models import Schedule as ScheduleRow

from ingestion.compilation import dispatch as compilation
from knowledgefs.jobs import schedules
from knowledgefs.jobs.schedules import Schedule
from retrieval.research_tasks import dispatch as research
from upgrades.services import dispatch as upgrade
from upgrades.services import reconciliation_runner as reconciliation

pytestmark = pytest.mark.django_db


def test_the_apps_register_their_schedules_when_django_starts():
    assert {
        reconciliation.RECOVERY_SCHEDULE: reconciliation.RECOVERY_FUNCTION,
        upgrade.SWEEP_SCHEDULE: upgrade.SWEEP_TASK,
        research.SWEEP_SCHEDULE: research.SWEEP_TASK,
    }.items() <= {name: s.func for name, s in schedules.SCHEDULES.items()}.items()


def test_ensure_repairs_the_row_the_migration_created_and_never_adds_a_second():
    migrated = ScheduleRow.objects.get(name=upgrade.SWEEP_SCHEDULE)
    ScheduleRow.objects.filter(pk=migrated.pk).update(func="broken", minutes=9, repeats=0)
    repaired = schedules.ensure(upgrade.SWEEP_SCHEDULE)
    assert repaired.pk == migrated.pk
    assert (repaired.func, repaired.schedule_type, repaired.minutes, repaired.repeats) == (
        upgrade.SWEEP_TASK,
        ScheduleRow.MINUTES,
        1,
        -1,
    )
    ScheduleRow.objects.all().delete()
    rows = schedules.ensure_all()
    assert [row.name for row in rows] == list(schedules.SCHEDULES)
    assert ScheduleRow.objects.count() == len(schedules.SCHEDULES)


def test_an_interval_in_seconds_is_rounded_up_to_whole_minutes(settings, monkeypatch):
    monkeypatch.setattr(schedules, "SCHEDULES", dict(schedules.SCHEDULES))
    settings.KNOWLEDGE_JOB_SWEEP_INTERVAL_SECONDS = 61
    every = schedules.register(
        Schedule("test.every", "x.y", seconds_setting="KNOWLEDGE_JOB_SWEEP_INTERVAL_SECONDS")
    )
    assert schedules.ensure(every.name).minutes == 2
    settings.KNOWLEDGE_JOB_SWEEP_INTERVAL_SECONDS = 5
    assert schedules.ensure(every.name).minutes == 1
    with pytest.raises(KeyError):
        schedules.ensure("test.nobody")


def test_the_dotted_paths_stored_in_schedule_rows_and_messages_still_import():
    from django.utils.module_loading import import_string

    from upgrades import tasks

    for schedule in schedules.SCHEDULES.values():
        assert callable(import_string(schedule.func)), schedule.func
    assert import_string(reconciliation.TASK_FUNCTION) is tasks.reconcile_documents
    assert import_string(reconciliation.RECOVERY_FUNCTION) is tasks.recover_reconciliations


def test_compilation_registers_its_recovery_sweep_and_ensure_writes_the_row_it_always_wrote(
    settings,
):
    registered = schedules.SCHEDULES[compilation.RECOVERY_SCHEDULE]
    assert registered is compilation.RECOVERY
    assert (registered.name, registered.func) == (
        "knowledgefs.recover_jobs",
        "ingestion.tasks.recover_jobs",
    )
    migrated = ScheduleRow.objects.get(name=compilation.RECOVERY_SCHEDULE)  # ingestion.0003
    settings.KNOWLEDGE_JOB_SWEEP_INTERVAL_SECONDS = 30
    row = compilation.ensure_recovery_schedule()
    assert row.pk == migrated.pk
    assert (row.name, row.func, row.schedule_type, row.minutes, row.repeats) == (
        migrated.name,
        migrated.func,
        migrated.schedule_type,
        migrated.minutes,
        migrated.repeats,
    )
    settings.KNOWLEDGE_JOB_SWEEP_INTERVAL_SECONDS = 150  # ceil(150 / 60) minutes
    assert (
        schedules.ensure(compilation.RECOVERY_SCHEDULE).minutes,
        ScheduleRow.objects.filter(name=compilation.RECOVERY_SCHEDULE).count(),
    ) == (3, 1)


def test_kfs_schedules_repairs_every_registered_sweep(capsys):
    import json

    from django.core.management import call_command

    ScheduleRow.objects.all().delete()
    call_command("kfs", "schedules", "--json")
    shown = json.loads(capsys.readouterr().out)
    assert shown["name"] == compilation.RECOVERY_SCHEDULE
    assert [s["name"] for s in shown["also"]] == [
        name for name in schedules.SCHEDULES if name != compilation.RECOVERY_SCHEDULE
    ]
    assert upgrade.SWEEP_SCHEDULE in {s["name"] for s in shown["also"]}
    assert set(ScheduleRow.objects.values_list("name", flat=True)) == set(schedules.SCHEDULES)
