"""The per-workspace cutover ledger: phases, compare-and-set version, time fences, the four
switches and the remote freeze / activation evidence, with their check constraints."""

from django.db import migrations, models

from knowledgefs.migration_ops import GuardedReversal


class Migration(migrations.Migration):

    dependencies = [
        ('upgrades', '0001_upgrade_jobs'),
    ]

    operations = [
        migrations.CreateModel(
            name='WorkspaceCutoverLedger',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('tenant_id', models.CharField(max_length=64, unique=True)),
                ('phase', models.CharField(choices=[('inventory', 'Inventory'), ('backfill', 'Backfill'), ('shadow', 'Shadow'), ('frozen', 'Frozen'), ('cutover', 'Cutover'), ('observing', 'Observing'), ('ready_for_cleanup', 'Ready for cleanup')], default='inventory', max_length=32)),
                ('cas_version', models.BigIntegerField(default=0)),
                ('freeze_at', models.DateTimeField(blank=True, null=True)),
                ('cutover_at', models.DateTimeField(blank=True, null=True)),
                ('rolled_back_at', models.DateTimeField(blank=True, null=True)),
                ('rollback_cutoff_at', models.DateTimeField(blank=True, null=True)),
                ('observation_started_at', models.DateTimeField(blank=True, null=True)),
                ('observation_ends_at', models.DateTimeField(blank=True, null=True)),
                ('maximum_task_expires_at', models.DateTimeField(blank=True, null=True)),
                ('irreversible_cleanup_at', models.DateTimeField(blank=True, null=True)),
                ('product_routes_enabled', models.BooleanField(default=False)),
                ('capability_v2_enabled', models.BooleanField(default=False)),
                ('integrated_mode_enabled', models.BooleanField(default=False)),
                ('legacy_acl_read_only', models.BooleanField(default=False)),
                ('remote_freeze_id', models.CharField(blank=True, max_length=128, null=True)),
                ('remote_freeze_revision', models.BigIntegerField(blank=True, null=True)),
                ('remote_freeze_acked_at', models.DateTimeField(blank=True, null=True)),
                ('activation_id', models.CharField(blank=True, max_length=128, null=True)),
                ('activation_revision', models.BigIntegerField(blank=True, null=True)),
                ('activation_ledger_cas_version', models.BigIntegerField(blank=True, null=True)),
                ('activation_acked_at', models.DateTimeField(blank=True, null=True)),
                ('smoke_results', models.JSONField(blank=True, null=True)),
                ('smoke_passed_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'db_table': 'upgrade_cutover_ledger',
                'constraints': [models.CheckConstraint(condition=models.Q(('phase__in', ['inventory', 'backfill', 'shadow', 'frozen', 'cutover', 'observing', 'ready_for_cleanup'])), name='upgrade_ledger_phase_ck'), models.CheckConstraint(condition=models.Q(('cas_version__gte', 0)), name='upgrade_ledger_cas_version_ck'), models.CheckConstraint(condition=models.Q(models.Q(('remote_freeze_acked_at__isnull', True), ('remote_freeze_id__isnull', True), ('remote_freeze_revision__isnull', True)), models.Q(('remote_freeze_acked_at__isnull', False), ('remote_freeze_id__isnull', False), ('remote_freeze_revision__isnull', False)), _connector='OR'), name='upgrade_ledger_freeze_evidence_ck'), models.CheckConstraint(condition=models.Q(models.Q(('activation_acked_at__isnull', True), ('activation_id__isnull', True), ('activation_ledger_cas_version__isnull', True), ('activation_revision__isnull', True)), models.Q(('activation_acked_at__isnull', False), ('activation_id__isnull', False), ('activation_ledger_cas_version__isnull', False), ('activation_revision__isnull', False)), _connector='OR'), name='upgrade_ledger_activation_evidence_ck'), models.CheckConstraint(condition=models.Q(models.Q(('smoke_passed_at__isnull', True), ('smoke_results__isnull', True)), models.Q(('smoke_passed_at__isnull', False), ('smoke_results__isnull', False)), _connector='OR'), name='upgrade_ledger_smoke_ck'), models.CheckConstraint(condition=models.Q(('cutover_at__isnull', True), ('freeze_at__isnull', False), _connector='OR'), name='upgrade_ledger_cutover_needs_freeze_ck'), models.CheckConstraint(condition=models.Q(('rollback_cutoff_at__isnull', True), ('cutover_at__isnull', False), _connector='OR'), name='upgrade_ledger_cutoff_needs_cutover_ck'), models.CheckConstraint(condition=models.Q(models.Q(('observation_ends_at__isnull', True), ('observation_started_at__isnull', True)), models.Q(('observation_ends_at__isnull', False), ('observation_started_at__isnull', False)), _connector='OR'), name='upgrade_ledger_observation_ck'), models.CheckConstraint(condition=models.Q(models.Q(('phase__in', ['frozen', 'cutover', 'observing', 'ready_for_cleanup']), _negated=True), models.Q(('freeze_at__isnull', False), ('remote_freeze_id__isnull', False)), _connector='OR'), name='upgrade_ledger_frozen_evidence_ck'), models.CheckConstraint(condition=models.Q(models.Q(('phase__in', ['cutover', 'observing', 'ready_for_cleanup']), _negated=True), models.Q(('activation_id__isnull', False), ('cutover_at__isnull', False)), _connector='OR'), name='upgrade_ledger_cutover_evidence_ck')],
            },
        ),
        # Last, so that it runs first when reversed: knowledgefs.downgrades.
        GuardedReversal(guard="upgrades.0002_cutover_ledger"),
    ]
