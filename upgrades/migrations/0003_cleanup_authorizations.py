"""Cleanup authorizations with three statuses (requested, approved, started): four-eyes approval,
an expiring approval window and the ledger version a start was taken under."""

import uuid

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('upgrades', '0002_cutover_ledger'),
    ]

    operations = [
        migrations.CreateModel(
            name='CleanupAuthorization',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('tenant_id', models.CharField(max_length=64)),
                ('status', models.CharField(choices=[('requested', 'Requested'), ('approved', 'Approved'), ('started', 'Started')], default='requested', max_length=16)),
                ('row_version', models.BigIntegerField(default=0)),
                ('reason', models.TextField(blank=True, default='')),
                ('requested_by', models.CharField(max_length=150)),
                ('requested_at', models.DateTimeField()),
                ('approved_by', models.CharField(blank=True, max_length=150, null=True)),
                ('approved_at', models.DateTimeField(blank=True, null=True)),
                ('approval_expires_at', models.DateTimeField(blank=True, null=True)),
                ('started_by', models.CharField(blank=True, max_length=150, null=True)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('started_ledger_cas_version', models.BigIntegerField(blank=True, null=True)),
                ('start_evidence', models.JSONField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('ledger', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='cleanup_authorizations', to='upgrades.workspacecutoverledger')),
            ],
            options={
                'db_table': 'upgrade_cleanup_authorization',
                'indexes': [models.Index(fields=['ledger', 'status'], name='upgrade_cleanup_ledger_idx')],
                'constraints': [
                    models.CheckConstraint(condition=models.Q(('status__in', ['requested', 'approved', 'started'])), name='upgrade_cleanup_status_ck'),
                    models.CheckConstraint(condition=models.Q(models.Q(('status', 'requested'), ('approval_expires_at__isnull', True), ('approved_at__isnull', True), ('approved_by__isnull', True), ('start_evidence__isnull', True), ('started_at__isnull', True), ('started_by__isnull', True), ('started_ledger_cas_version__isnull', True)), models.Q(('status', 'approved'), ('approval_expires_at__isnull', False), ('approved_at__isnull', False), ('approved_by__isnull', False), ('start_evidence__isnull', True), ('started_at__isnull', True), ('started_by__isnull', True), ('started_ledger_cas_version__isnull', True)), models.Q(('status', 'started'), ('approval_expires_at__isnull', False), ('approved_at__isnull', False), ('approved_by__isnull', False), ('start_evidence__isnull', False), ('started_at__isnull', False), ('started_by__isnull', False), ('started_ledger_cas_version__isnull', False)), _connector='OR'), name='upgrade_cleanup_status_fields_ck'),
                    models.CheckConstraint(condition=models.Q(('row_version__gte', 0), models.Q(('started_ledger_cas_version__isnull', True), ('started_ledger_cas_version__gte', 0), _connector='OR')), name='upgrade_cleanup_ledger_versions_ck'),
                    models.CheckConstraint(condition=models.Q(('approved_by__isnull', True), models.Q(('approved_by', models.F('requested_by')), _negated=True), _connector='OR'), name='upgrade_cleanup_four_eyes_ck'),
                    models.CheckConstraint(condition=models.Q(('approval_expires_at__isnull', True), ('approval_expires_at__gt', models.F('approved_at')), _connector='OR'), name='upgrade_cleanup_approval_window_ck'),
                ],
            },
        ),
    ]
