"""Parser isolation: a parse that spins forever is killed at its hard limit with everything it
started, a crash and a memory blow-up end with stable codes, and BC-15's damaged PDFs end within
the budget through compilation while the worker stays available."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from ingestion.compilation.operations import cancel_job
from ingestion.compilation.pipeline import compile_jobs, run_job
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document
from ingestion.parsing import ParseError
from ingestion.parsing.isolation import IsolationConfig, ParserTimeout, parse_isolated
from knowledgefs.testing.isolation_targets import MARKER
from knowledgefs.testing.pdf_fixtures import bc15_variants, processes_with, wait_gone

# --- tests --------------------------------------------------------------------------------------


def _new_sleepers(before: set[int]) -> list[int]:
    """The ``sleep MARKER`` processes not in ``before`` (another run's leftovers don't count)."""
    return [p for p in processes_with(f"sleep\x00{MARKER}") if p not in before]


def test_a_parse_that_spins_forever_is_killed_at_the_limit_with_its_grandchildren():
    before = set(processes_with(f"sleep\x00{MARKER}"))
    started = time.monotonic()
    with pytest.raises(ParserTimeout) as exc:
        parse_isolated(
            b"x",
            "text/plain",
            config=IsolationConfig(timeout_s=2.0),
            target="knowledgefs.testing.isolation_targets:spin_forever",
        )
    elapsed = time.monotonic() - started
    assert 2.0 <= elapsed < 4.0, elapsed  # the calling thread is free right after the limit
    assert "exceeded its limit of 2 s" in str(exc.value)
    assert wait_gone(_new_sleepers(before)) == []


def test_the_same_parse_runs_again_normally_after_a_timeout():
    report = parse_isolated(b"Alpha.\n\nBeta.", "text/plain", config=IsolationConfig(timeout_s=30))
    assert [e.text for e in report.elements] == ["Alpha.", "Beta."]


def test_a_crashing_parser_is_parser_crashed():
    with pytest.raises(ParseError) as exc:
        parse_isolated(b"x", "text/plain", target="knowledgefs.testing.isolation_targets:crash")
    assert exc.value.code == "parser_crashed"
    assert exc.value.message == "the parser process died (SIGSEGV); the document was not parsed"


def test_a_parse_over_the_memory_cap_is_parser_memory_exceeded():
    with pytest.raises(ParseError) as exc:
        parse_isolated(
            b"x",
            "text/plain",
            config=IsolationConfig(timeout_s=30, memory_bytes=768 * 1024 * 1024),
            target="knowledgefs.testing.isolation_targets:eat_memory",
        )
    assert exc.value.code == "parser_memory_exceeded"
    assert "memory limit of 768 MiB" in exc.value.message


def test_parse_errors_cross_the_process_boundary_with_their_code():
    with pytest.raises(ParseError) as exc:
        parse_isolated(b"%PDF-1.4\nnot really", "application/pdf")
    assert (exc.value.code, exc.value.message) == ("corrupt_pdf", "corrupt or unreadable PDF")


@pytest.mark.django_db
def test_a_parser_timeout_in_compilation_is_terminal_and_the_worker_moves_on(
    space, settings, monkeypatch
):
    from ingestion.parsing import isolation

    settings.KNOWLEDGE_PARSER_TIMEOUT_SECONDS = 2
    real = isolation.parse_isolated

    def spinning_for_pdfs(data, mime_type, **kwargs):
        if mime_type == "application/pdf":
            kwargs["target"] = "knowledgefs.testing.isolation_targets:spin_forever"
        return real(data, mime_type, **kwargs)

    monkeypatch.setattr(isolation, "parse_isolated", spinning_for_pdfs)
    before = set(processes_with(f"sleep\x00{MARKER}"))
    stuck = admit_document(space, filename="loop.pdf", data=bc15_variants()["startxref"])
    fine = admit_document(space, filename="fine.txt", data=b"Still indexed. " * 30)
    started = time.monotonic()
    compile_jobs([stuck.job.id, fine.job.id])
    assert time.monotonic() - started < 20
    job = CompilationJob.objects.get(id=stuck.job.id)
    assert (job.run_state, job.error_code, job.execution_attempts) == (
        "failed",
        "parser_timeout",
        1,
    )
    assert Document.objects.get(id=fine.document.id).state == "published"
    assert wait_gone(_new_sleepers(before)) == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("variant", "outcome"),
    [
        ("truncated", ("failed", "corrupt_pdf")),
        ("startxref", ("published", "")),  # pypdf rebuilds the cross-reference table
        ("garbage", ("failed", "corrupt_pdf")),
    ],
)
def test_bc15_damaged_pdfs_end_within_the_budget(space, variant, outcome):
    data = bc15_variants()[variant]
    if variant == "garbage":
        assert len(data) == 77 and data.startswith(b"%PDF-1.4")
    admission = admit_document(space, filename=f"{variant}.pdf", data=data, enqueue=False)
    started = time.monotonic()
    run_job(admission.job.id)
    assert time.monotonic() - started < 30
    document = Document.objects.get(id=admission.document.id)
    job = CompilationJob.objects.get(id=admission.job.id)
    assert (document.state, document.error_code) == outcome
    if outcome[0] == "failed":
        assert document.error_message == "corrupt or unreadable PDF"
        assert (job.run_state, job.execution_attempts) == ("failed", 1)  # terminal, no retry
    else:
        assert document.node_count >= 1


def _session_of(pid: int) -> int | None:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[3])


def test_a_parse_dies_with_its_worker_when_the_worker_is_sigkilled():
    """The worker (a real process calling parse_isolated with a 60 s limit) is SIGKILLed while
    its parse spins: within a few seconds no process of that parse's session remains, and its
    per-parse directory (with the copy of the document) is gone too."""
    import os
    import signal
    import subprocess
    import sys

    code = (
        "from ingestion.parsing import rasterize\n"
        "from ingestion.parsing.isolation import IsolationConfig, parse_isolated\n"
        "parse_isolated(b'x', 'text/plain', config=IsolationConfig(timeout_s=60),\n"
        "               raster=rasterize.RasterConfig(),\n"
        "               target='knowledgefs.testing.isolation_targets:spin_forever')\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    stale = set(processes_with(f"sleep\x00{MARKER}"))
    # A short root of its own, not under tmp_path: the forkserver's listening socket lives in
    # TMPDIR/pymp-*/listener-*, and an AF_UNIX path has at most 107 bytes (a test pass's own
    # TMPDIR plus pytest's folders passed it).
    temp_root = Path(tempfile.mkdtemp(prefix="iso-", dir="/tmp"))
    env = {**os.environ, "TMPDIR": str(temp_root)}
    worker = subprocess.Popen([sys.executable, "-c", code], cwd=root, env=env)
    try:
        deadline = time.monotonic() + 60
        sleepers: list[int] = []
        while not sleepers and time.monotonic() < deadline:
            sleepers = [p for p in processes_with(f"sleep\x00{MARKER}") if p not in stale]
            time.sleep(0.1)
        assert sleepers, "the parse did not start"
        session = _session_of(sleepers[0])
        assert session is not None and session != os.getsid(0)
        members = [
            int(p) for p in os.listdir("/proc") if p.isdigit() and _session_of(int(p)) == session
        ]
        assert session in members  # the parser child leads the session
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        assert wait_gone(members, seconds=8.0) == [], members
        # (the killed worker's own multiprocessing directory, pymp-*, is not the parse's)
        assert [e for e in os.listdir(temp_root) if not e.startswith("pymp-")] == []
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        shutil.rmtree(temp_root, ignore_errors=True)


def test_a_parse_killed_at_its_timeout_leaves_no_temporary_files(tmp_path, monkeypatch):
    import os
    import tempfile

    from knowledgefs.testing.isolation_targets import TEMP_MARKER

    root = tmp_path / "tmp-root"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    before = {e for e in os.listdir("/tmp") if e.startswith(TEMP_MARKER)}
    with pytest.raises(ParserTimeout):
        parse_isolated(
            b"%PDF-1.4 a private document",
            "application/pdf",
            config=IsolationConfig(timeout_s=2.0),
            target="knowledgefs.testing.isolation_targets:spin_with_temp_files",
        )
    assert os.listdir(root) == []
    assert {e for e in os.listdir("/tmp") if e.startswith(TEMP_MARKER)} - before == set()


def test_a_parse_asked_to_stop_is_killed_within_about_a_second():
    from ingestion.parsing.isolation import ParseCanceled

    before = set(processes_with(f"sleep\x00{MARKER}"))
    started = time.monotonic()
    with pytest.raises(ParseCanceled):
        parse_isolated(
            b"x",
            "text/plain",
            config=IsolationConfig(timeout_s=60),
            target="knowledgefs.testing.isolation_targets:spin_forever",
            should_stop=lambda: time.monotonic() - started > 1.5,
        )
    assert time.monotonic() - started < 5
    assert wait_gone(_new_sleepers(before)) == []


@pytest.mark.django_db(transaction=True)
def test_a_job_canceled_during_its_parse_stops_the_parse(space, settings, monkeypatch):
    import threading

    from ingestion.parsing import isolation

    settings.KNOWLEDGE_PARSER_TIMEOUT_SECONDS = 60
    real = isolation.parse_isolated

    def spinning(data, mime_type, **kwargs):
        kwargs["target"] = "knowledgefs.testing.isolation_targets:spin_forever"
        return real(data, mime_type, **kwargs)

    monkeypatch.setattr(isolation, "parse_isolated", spinning)
    before = set(processes_with(f"sleep\x00{MARKER}"))
    # Markdown: small plain text is parsed in the worker, without a child to cancel.
    admission = admit_document(space, filename="slow.md", data=b"# Slow\n\n" + b"Some text. " * 30)
    worker = threading.Thread(target=compile_jobs, args=([admission.job.id],))
    worker.start()
    deadline = time.monotonic() + 30
    while not _new_sleepers(before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _new_sleepers(before), "the parse did not start"
    started = time.monotonic()
    cancel_job(admission.job.id)
    worker.join(30)
    assert not worker.is_alive()
    assert time.monotonic() - started < 10
    assert CompilationJob.objects.get(id=admission.job.id).run_state == "canceled"
    assert wait_gone(_new_sleepers(before)) == []


def _children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live children of ``pid``."""
    import os
    from pathlib import Path

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] not in ("Z", "X") and int(fields[1]) == pid:
            found.append((int(entry), cmdline))
    return found


def test_the_idle_forkserver_exits_when_its_worker_is_sigkilled():
    """A worker that parsed once keeps an idle parser forkserver; SIGKILLed (its cleanup never
    runs), the forkserver must not stay behind as an orphan."""
    import os
    import signal
    import subprocess
    import sys

    code = (
        "import sys, time\n"
        "from ingestion.parsing import rasterize\n"
        "from ingestion.parsing.isolation import parse_isolated\n"
        "parse_isolated(b'Alpha.', 'text/plain', raster=rasterize.RasterConfig())\n"
        "print('parsed', flush=True)\n"
        "time.sleep(600)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    worker = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE)
    try:
        assert worker.stdout.readline().strip() == b"parsed"
        servers = [p for p, cmd in _children_of(worker.pid) if "forkserver" in cmd]
        assert len(servers) == 1, _children_of(worker.pid)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        assert wait_gone(servers, seconds=8.0) == [], servers
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_the_forkserver_and_a_stuck_parse_end_when_the_worker_is_sigkilled():
    """A parse stuck in native code holding the GIL (its watchdog cannot run) keeps a copy of
    the forkserver's liveness pipe; the forkserver must still notice its worker is gone, and
    its exit ends the stuck child (PR_SET_PDEATHSIG)."""
    import os
    import signal
    import subprocess
    import sys

    code = (
        "import sys, threading, time\n"
        "from ingestion.parsing import rasterize\n"
        "from ingestion.parsing.isolation import IsolationConfig, parse_isolated\n"
        "parse_isolated(b'Alpha.', 'text/plain', raster=rasterize.RasterConfig())\n"
        "print('parsed', flush=True)\n"
        "parse_isolated(b'x', 'text/plain', config=IsolationConfig(timeout_s=600),\n"
        "               raster=rasterize.RasterConfig(),\n"
        "               target='knowledgefs.testing.isolation_targets:hold_the_interpreter')\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    worker = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE)
    try:
        assert worker.stdout.readline().strip() == b"parsed"
        (server,) = [p for p, cmd in _children_of(worker.pid) if "forkserver" in cmd]
        deadline = time.monotonic() + 30
        stuck: list[int] = []
        while not stuck and time.monotonic() < deadline:
            stuck = [p for p, _ in _children_of(server)]
            time.sleep(0.1)
        assert stuck, "the parse did not start"
        time.sleep(1.0)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        assert wait_gone([server, *stuck], seconds=10.0) == [], (server, stuck)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
