"""A real ``manage.py qcluster`` stopped the way service managers stop it.

systemd (default ``KillMode=control-group``), ``kill -- -PGID``, Docker and Kubernetes send
SIGTERM to every process of the worker at once. The cluster must then end within its grace
period, every process of its group gone, and the jobs it was running handed back (``queued``,
no lease) so another worker resumes them at once and each is published once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest

from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, KnowledgeNode
from knowledgefs.testing.qcluster_process import QClusterProcess
from retrieval.backends import get_search_backend

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

GRACE_S = 30  # what compose gives (stop_grace_period 60 s), halved for a loaded machine


@pytest.fixture(autouse=True)
def same_model_as_the_cluster(settings):
    from knowledgefs.runtime import DEFAULT_MODEL_ID

    settings.KNOWLEDGE_EMBEDDING_MODELS = {
        DEFAULT_MODEL_ID: "knowledgefs.testing.cluster_support.SlowEmbedder"
    }


def _group(pgid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live process of process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append((int(entry), cmdline.strip()))
    return members


def _wait(condition, seconds: float, step: float = 0.1):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step)
    return None


def _expected_nodes(job) -> int:
    from django.conf import settings

    from ingestion import parsing
    from ingestion.chunking import chunk_elements
    from knowledgefs import storage

    document = Document.objects.get(id=job.document_id)
    report = parsing.parse_with_report(
        storage.read_object(document.storage_key, max_bytes=document.size_bytes),
        document.mime_type,
    )
    return len(
        chunk_elements(
            report.elements,
            target_chars=settings.KNOWLEDGE_CHUNK_TARGET_CHARS,
            overlap_chars=settings.KNOWLEDGE_CHUNK_OVERLAP_CHARS,
        )
    )


@pytest.mark.parametrize("to", ["group", "main"])
def test_sigterm_stops_the_cluster_in_its_grace_period_and_hands_the_job_back(
    space, object_storage, tmp_path, to
):
    """``group``: systemd, ``kill -- -PGID``, Kubernetes; ``main``: Docker without an init
    that forwards to the group, ``scripts/serve.sh``."""
    text = "\n\n".join(f"Paragraph {p}: tides and volcanoes, claim {p}." * 8 for p in range(40))
    # Markdown: its parse runs in the forkserver's child (small plain text is parsed in the
    # worker), so the group holds the forkserver this test expects to go with it.
    job = admit_document(space, filename="long.md", data=text.encode()).job
    expected = _expected_nodes(job)
    log = tmp_path / "qcluster.log"
    cluster = QClusterProcess(object_storage, log, KFS_TEST_EMBED_DELAY="0.2").start()
    pgid = cluster.process.pid
    try:
        assert _wait(
            lambda: (CompilationJob.objects.get(id=job.id).progress or {}).get("nodes_embedded"),
            90,
        ), log.read_text()
        members = _group(pgid)
        # the sentinel, its workers, pusher and monitor, and the parser forkserver
        assert any("forkserver" in cmd for _, cmd in members), members
        if to == "group":
            os.killpg(pgid, signal.SIGTERM)
        else:
            os.kill(pgid, signal.SIGTERM)
        sent = time.monotonic()
        gone = _wait(lambda: not _group(pgid), GRACE_S, step=0.2)
        took = time.monotonic() - sent
        assert gone, (_group(pgid), log.read_text()[-3000:])
        assert cluster.process.wait(timeout=5) is not None
        # handed back, not killed: well inside the 20 s grace period of the settings
        assert took < 15, took
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    job.refresh_from_db()
    # handed back: queued, no lease, dispatched again (a claim for the next worker)
    assert (job.run_state, job.lease_token, job.lease_expires_at) == ("queued", None, None)
    assert job.task_id, "the job was not dispatched again"
    embedded = job.progress.get("nodes_embedded")
    assert embedded and embedded < expected  # stopped mid-embedding
    attempts = job.execution_attempts
    # another worker resumes it at once (no lease to wait out, no sweep) and publishes it once
    restarted = QClusterProcess(object_storage, log).start()
    try:
        assert _wait(
            lambda: CompilationJob.objects.filter(id=job.id, run_state="succeeded").exists(), 90
        ), CompilationJob.objects.get(id=job.id).run_state
    finally:
        restarted.stop()
    job.refresh_from_db()
    document = Document.objects.get(id=job.document_id)
    assert document.state == "published"
    nodes = KnowledgeNode.objects.filter(document=document)
    assert nodes.count() == expected == document.node_count
    assert set(nodes.values_list("generation", flat=True)) == {document.active_generation}
    assert job.execution_attempts == attempts + 1
    assert get_search_backend().projection_counts(space.id) == {
        "keyword": expected,
        "dense": expected,
    }


def test_a_handed_back_job_starts_at_once_on_another_cluster(space, object_storage, tmp_path):
    """The stopping cluster's own pusher must not take the message its worker hands the job
    back with: it would stay locked in the ORM broker until the retry time, and the job would
    wait for the recovery sweep (KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS, 300 s by default)
    instead of starting at once on the next cluster. A pusher polling every 20 ms and a main
    process that acts on the group's SIGTERM a second after the workers make the window wide:
    the pusher must be stopped before any job is handed back."""
    from django.conf import settings
    from django.utils import timezone
    from django_q.models import OrmQ

    assert settings.KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS >= 300
    text = "\n\n".join(f"Paragraph {p}: tides and volcanoes, claim {p}." * 8 for p in range(40))
    # Markdown: its parse runs in the forkserver's child (small plain text is parsed in the
    # worker), so the group holds the forkserver this test expects to go with it.
    job = admit_document(space, filename="long.md", data=text.encode()).job
    log = tmp_path / "qcluster.log"
    polling = {"KFS_TEST_Q_POLL": "0.02"}
    cluster = QClusterProcess(object_storage, log, KFS_TEST_EMBED_DELAY="0.2", **polling).start()
    pgid = cluster.process.pid
    try:
        assert _wait(
            lambda: (CompilationJob.objects.get(id=job.id).progress or {}).get("nodes_embedded"),
            90,
        ), log.read_text()
        # A group SIGTERM as a loaded machine may deliver it: the workers (and the pusher)
        # act on it a second before the main process does.
        sent = timezone.now()
        for pid, _ in _group(pgid):
            if pid != pgid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        time.sleep(1)
        os.kill(pgid, signal.SIGTERM)
        assert _wait(lambda: not _group(pgid), GRACE_S, step=0.2), log.read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    job.refresh_from_db()
    assert (job.run_state, job.lease_token) == ("queued", None)
    # The pusher locks a message it takes until now + retry: none was taken after the SIGTERM.
    retry = timedelta(seconds=settings.Q_CLUSTER["retry"])
    taken_late = [
        (pk, lock - retry)
        for pk, lock in OrmQ.objects.values_list("id", "lock")
        if lock - retry >= sent
    ]
    assert not taken_late, (sent, taken_late, log.read_text()[-3000:])
    restarted = QClusterProcess(object_storage, log, **polling).start()
    started = time.monotonic()
    try:
        published = _wait(
            lambda: CompilationJob.objects.filter(id=job.id, run_state="succeeded").exists(), 60
        )
        took = time.monotonic() - started
    finally:
        restarted.stop()
    job.refresh_from_db()
    assert published, (job.run_state, took, log.read_text()[-3000:])
    assert Document.objects.get(id=job.document_id).state == "published"


def test_serve_sh_stops_the_api_and_the_worker_when_it_alone_gets_sigterm(tmp_path):
    """``make serve`` (scripts/serve.sh) runs gunicorn and a qcluster; SIGTERM to the script
    alone (``kill PID``) must stop both within the grace period, not wait for gunicorn."""
    import socket
    import subprocess
    import sys

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "knowledgefs.settings",
        "KNOWLEDGE_VAR_DIR": str(tmp_path / "var"),
    }
    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], cwd=root, env=env, check=True, timeout=180
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env["KNOWLEDGE_BIND"] = f"127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - the child writes it
    script = subprocess.Popen(
        ["bash", "scripts/serve.sh"],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pgid = script.pid
    try:

        def up() -> bool:
            members = " ".join(cmd for _, cmd in _group(pgid))
            if "gunicorn" not in members or members.count("qcluster") < 3:
                return False
            with socket.socket() as client:
                return client.connect_ex(("127.0.0.1", port)) == 0

        assert _wait(up, 60, step=0.5), (tmp_path / "serve.log").read_text()[-2000:]
        time.sleep(2)  # the cluster's sentinel has started its workers
        os.kill(script.pid, signal.SIGTERM)
        sent = time.monotonic()
        gone = _wait(lambda: not _group(pgid), GRACE_S, step=0.2)
        assert gone, (_group(pgid), (tmp_path / "serve.log").read_text()[-2000:])
        assert time.monotonic() - sent < 20
        assert script.wait(timeout=5) != 0  # ended by the signal (143)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        log.close()
