"""Research tasks and their partial evidence, and the every-minute django-q2 schedule of their
recovery sweep (``retrieval.research_tasks.dispatch.sweep``). Reversible: unapplying drops both
tables and removes the schedule."""

import django.db.models.deletion
import uuid
from django.db import migrations, models

from knowledgefs.migration_ops import every_minute_schedule


class Migration(migrations.Migration):

    dependencies = [
        ('retrieval', '0005_answer_traces'),
        ('spaces', '0005_space_profiles'),
        ('django_q', '0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more'),
    ]

    operations = [
        migrations.CreateModel(
            name='ResearchTask',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('tenant_id', models.CharField(max_length=64)),
                ('owner', models.CharField(max_length=300)),
                ('api_key_id', models.UUIDField(blank=True, null=True)),
                ('subject', models.CharField(blank=True, default='', max_length=256)),
                ('caller_kind', models.CharField(blank=True, default='', max_length=32)),
                ('idempotency_key', models.CharField(blank=True, max_length=255, null=True)),
                ('request_fingerprint', models.CharField(blank=True, default='', max_length=64)),
                ('query', models.TextField()),
                ('top_k', models.PositiveSmallIntegerField()),
                ('score_threshold', models.FloatField(blank=True, null=True)),
                ('filters', models.JSONField(blank=True, null=True)),
                ('limits', models.JSONField(default=dict)),
                ('plan', models.JSONField(blank=True, default=dict)),
                ('run_state', models.CharField(choices=[('queued', 'Queued'), ('running', 'Running'), ('completed', 'Completed'), ('failed', 'Failed'), ('canceled', 'Canceled')], default='queued', max_length=16)),
                ('stage', models.CharField(choices=[('queued', 'Queued'), ('planning', 'Planning'), ('retrieving', 'Retrieving'), ('analyzing', 'Analyzing'), ('generating', 'Generating'), ('completed', 'Completed'), ('failed', 'Failed'), ('canceled', 'Canceled')], default='queued', max_length=16)),
                ('checkpoint', models.JSONField(blank=True, default=dict)),
                ('result', models.JSONField(blank=True, null=True)),
                ('error_code', models.CharField(blank=True, default='', max_length=64)),
                ('error_message', models.TextField(blank=True, default='')),
                ('attempt_count', models.PositiveIntegerField(default=0)),
                ('resume_count', models.PositiveIntegerField(default=0)),
                ('elapsed_ms', models.PositiveIntegerField(default=0)),
                ('task_id', models.CharField(blank=True, max_length=64, null=True)),
                ('claimed_at', models.DateTimeField(blank=True, null=True)),
                ('step_started_at', models.DateTimeField(blank=True, null=True)),
                ('heartbeat_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('space', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='research_tasks', to='spaces.knowledgespace')),
            ],
            options={
                'db_table': 'research_task',
            },
        ),
        migrations.CreateModel(
            name='ResearchTaskPartial',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('sequence', models.PositiveIntegerField()),
                ('kind', models.CharField(max_length=16)),
                ('evidence', models.JSONField(default=dict)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('task', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='partials', to='retrieval.researchtask')),
            ],
            options={
                'db_table': 'research_task_partial',
            },
        ),
        migrations.AddIndex(
            model_name='researchtask',
            index=models.Index(fields=['run_state', 'updated_at'], name='research_task_state_idx'),
        ),
        migrations.AddIndex(
            model_name='researchtask',
            index=models.Index(fields=['space', '-created_at'], name='research_task_space_idx'),
        ),
        migrations.AddConstraint(
            model_name='researchtask',
            constraint=models.UniqueConstraint(fields=('tenant_id', 'idempotency_key'), name='research_task_idempotency_uq'),
        ),
        migrations.AddConstraint(
            model_name='researchtask',
            constraint=models.CheckConstraint(condition=models.Q(('top_k__gte', 1), ('top_k__lte', 50)), name='research_task_top_k_ck'),
        ),
        migrations.AddConstraint(
            model_name='researchtaskpartial',
            constraint=models.UniqueConstraint(fields=('task', 'sequence'), name='research_task_partial_sequence_uq'),
        ),
        every_minute_schedule(
            'knowledgefs.research_tasks.sweep',
            'retrieval.research_tasks.tasks.sweep_research_tasks',
        ),
    ]
