"""``manage.py qcluster``: django-q2's command with a stop that ends in time.

Same options as django-q2's; the cluster is :class:`knowledgefs.jobs.worker_runtime.Cluster`,
which stops within ``KNOWLEDGE_WORKER_SHUTDOWN_GRACE_SECONDS`` on SIGTERM to its main process
or to its whole process group and hands running jobs back (docs/operations.md, "Stopping a
worker").
"""

from __future__ import annotations

from typing import Any

from django_q.management.commands.qcluster import Command as QClusterCommand

from knowledgefs.jobs.worker_runtime import Cluster


# django-q2 ships no type information: its command is Any to mypy.
class Command(QClusterCommand):  # type: ignore[misc]
    def handle(self, *args: Any, **options: Any) -> None:
        import os

        from django.conf import settings

        settings.SECRET_KEY  # noqa: B018 - refuse to start without it, as django-q2 does
        if options.get("cluster_name"):
            os.environ["Q_CLUSTER_NAME"] = options["cluster_name"]
        cluster = Cluster()
        cluster.start()
        if options.get("run_once", False):
            cluster.stop()
