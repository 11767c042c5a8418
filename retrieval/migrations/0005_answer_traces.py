"""Answer traces: one row per answer run (steps, evidence ids, answerability; no prompt or
answer text)."""

import django.db.models.deletion
import uuid
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('retrieval', '0004_mysql_one_index_version_per_state'),
        ('spaces', '0005_space_profiles'),
    ]

    operations = [
        migrations.CreateModel(
            name='AnswerTrace',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('tenant_id', models.CharField(max_length=64)),
                ('requester_kind', models.CharField(max_length=16)),
                ('requester', models.CharField(max_length=300)),
                ('api_key_id', models.UUIDField(blank=True, null=True)),
                ('grant_id', models.CharField(blank=True, default='', max_length=128)),
                ('source', models.CharField(choices=[('service_api', 'Service API'), ('cli', 'Command line'), ('retrieval_test', 'Test')], max_length=16)),
                ('requested_mode', models.CharField(blank=True, default='', max_length=16)),
                ('mode', models.CharField(max_length=16)),
                ('query_sha256', models.CharField(max_length=64)),
                ('query_chars', models.PositiveIntegerField()),
                ('steps', models.JSONField(blank=True, default=list)),
                ('evidence_node_ids', models.JSONField(blank=True, default=list)),
                ('answerability', models.CharField(blank=True, default='', max_length=24)),
                ('finish_reason', models.CharField(blank=True, default='', max_length=32)),
                ('error_code', models.CharField(blank=True, default='', max_length=64)),
                ('completed', models.BooleanField(default=False)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('completed_at', models.DateTimeField(blank=True, null=True)),
                ('space', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='spaces.knowledgespace')),
            ],
            options={
                'indexes': [models.Index(fields=['tenant_id', '-created_at'], name='answer_trace_tenant'), models.Index(fields=['space', '-created_at'], name='answer_trace_space')],
            },
        ),
    ]
