"""The staged run's recovery sweep as a django-q2 schedule (every minute), owned by the schema.

Reversible: unapplying removes the schedule. ``kfs upgrade schedules`` recreates it if an
operator deleted it by hand.
"""

from django.db import migrations

NAME = "knowledgefs.upgrades.sweep"
FUNC = "upgrades.tasks.sweep_upgrades"


def create_schedule(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name=NAME,
        defaults={"func": FUNC, "schedule_type": "I", "minutes": 1, "repeats": -1},
    )


def delete_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("upgrades", "0005_reconciliation_recovery_schedule"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(create_schedule, delete_schedule)]
