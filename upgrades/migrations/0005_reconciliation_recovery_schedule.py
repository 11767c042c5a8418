"""The reconciliation recovery tick as a django-q2 schedule (every minute), owned by the schema.

Reversible: unapplying removes the schedule. ``kfs schedules`` recreates it if an operator
deleted it by hand.
"""

from django.db import migrations

from knowledgefs.migration_ops import every_minute_schedule

NAME = "knowledgefs.recover_reconciliations"
FUNC = "upgrades.reconciliation_tasks.recover_reconciliations"


class Migration(migrations.Migration):
    dependencies = [
        ("upgrades", "0004_cleanup_completion"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [every_minute_schedule(NAME, FUNC)]
