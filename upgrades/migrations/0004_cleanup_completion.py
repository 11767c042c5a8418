"""Cleanup authorizations gain the ``completed`` status, its four columns and the checks that
use them.

The operations are ordered so that the reverse runs in the order a populated downgrade needs:
(1) ``completed`` rows go back to ``started`` with their completion columns cleared, (2) the new
checks are dropped, (3) the three-status checks are restored, (4) the columns are dropped.
Restoring the old checks first would fail on any completed row.
"""

from django.db import migrations, models

from knowledgefs.migration_ops import GuardedReversal


def completion_needs_no_backfill(apps, schema_editor):
    """Forwards: nothing to change; no row can be ``completed`` before this status exists."""


def demote_completed_to_started(apps, schema_editor):
    """Backwards: every ``completed`` authorization becomes ``started`` again and loses its
    completion fields, so the three-status checks can be restored. The ledger keeps its
    ``irreversible_cleanup_at``: the cleanup did start."""
    authorization = apps.get_model("upgrades", "CleanupAuthorization")
    authorization.objects.using(schema_editor.connection.alias).filter(status="completed").update(
        status="started",
        completed_by=None,
        completed_at=None,
        completion_evidence=None,
        completed_ledger_cas_version=None,
        row_version=models.F("row_version") + 1,
    )


class Migration(migrations.Migration):

    dependencies = [
        ('upgrades', '0003_cleanup_authorizations'),
    ]

    operations = [
        # (4) reversed last: the columns.
        migrations.AddField(
            model_name='cleanupauthorization',
            name='completed_by',
            field=models.CharField(blank=True, max_length=150, null=True),
        ),
        migrations.AddField(
            model_name='cleanupauthorization',
            name='completed_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='cleanupauthorization',
            name='completion_evidence',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='cleanupauthorization',
            name='completed_ledger_cas_version',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='cleanupauthorization',
            name='status',
            field=models.CharField(choices=[('requested', 'Requested'), ('approved', 'Approved'), ('started', 'Started'), ('completed', 'Completed')], default='requested', max_length=16),
        ),
        # (3) reversed third: the three-status checks come back.
        migrations.RemoveConstraint(
            model_name='cleanupauthorization',
            name='upgrade_cleanup_status_ck',
        ),
        migrations.RemoveConstraint(
            model_name='cleanupauthorization',
            name='upgrade_cleanup_status_fields_ck',
        ),
        migrations.RemoveConstraint(
            model_name='cleanupauthorization',
            name='upgrade_cleanup_ledger_versions_ck',
        ),
        # (2) reversed second: the new checks go.
        migrations.AddConstraint(
            model_name='cleanupauthorization',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['requested', 'approved', 'started', 'completed'])), name='upgrade_cleanup_status_ck'),
        ),
        migrations.AddConstraint(
            model_name='cleanupauthorization',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('status', 'requested'), ('approval_expires_at__isnull', True), ('approved_at__isnull', True), ('approved_by__isnull', True), ('completed_at__isnull', True), ('completed_by__isnull', True), ('completed_ledger_cas_version__isnull', True), ('completion_evidence__isnull', True), ('start_evidence__isnull', True), ('started_at__isnull', True), ('started_by__isnull', True), ('started_ledger_cas_version__isnull', True)), models.Q(('status', 'approved'), ('approval_expires_at__isnull', False), ('approved_at__isnull', False), ('approved_by__isnull', False), ('completed_at__isnull', True), ('completed_by__isnull', True), ('completed_ledger_cas_version__isnull', True), ('completion_evidence__isnull', True), ('start_evidence__isnull', True), ('started_at__isnull', True), ('started_by__isnull', True), ('started_ledger_cas_version__isnull', True)), models.Q(('status', 'started'), ('approval_expires_at__isnull', False), ('approved_at__isnull', False), ('approved_by__isnull', False), ('start_evidence__isnull', False), ('started_at__isnull', False), ('started_by__isnull', False), ('started_ledger_cas_version__isnull', False), ('completed_at__isnull', True), ('completed_by__isnull', True), ('completed_ledger_cas_version__isnull', True), ('completion_evidence__isnull', True)), models.Q(('status', 'completed'), ('approval_expires_at__isnull', False), ('approved_at__isnull', False), ('approved_by__isnull', False), ('completed_at__isnull', False), ('completed_by__isnull', False), ('completed_ledger_cas_version__isnull', False), ('completion_evidence__isnull', False), ('start_evidence__isnull', False), ('started_at__isnull', False), ('started_by__isnull', False), ('started_ledger_cas_version__isnull', False)), _connector='OR'), name='upgrade_cleanup_status_fields_ck'),
        ),
        migrations.AddConstraint(
            model_name='cleanupauthorization',
            constraint=models.CheckConstraint(condition=models.Q(('row_version__gte', 0), models.Q(('started_ledger_cas_version__isnull', True), ('started_ledger_cas_version__gte', 0), _connector='OR'), models.Q(('completed_ledger_cas_version__isnull', True), ('completed_ledger_cas_version__gte', models.F('started_ledger_cas_version')), _connector='OR')), name='upgrade_cleanup_ledger_versions_ck'),
        ),
        migrations.AddConstraint(
            model_name='cleanupauthorization',
            constraint=models.CheckConstraint(condition=models.Q(('completed_at__isnull', True), ('completed_at__gte', models.F('started_at')), _connector='OR'), name='upgrade_cleanup_completion_time_ck'),
        ),
        # (1) reversed first: completed rows back to started.
        migrations.RunPython(completion_needs_no_backfill, demote_completed_to_started),
        # Last, so that it runs first when reversed: knowledgefs.downgrades.
        GuardedReversal(guard="upgrades.0004_cleanup_completion"),
    ]
