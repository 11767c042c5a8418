"""Operator screens for compilation jobs and API keys, driven in a real headless browser.

Playwright's Python package drives Debian's ``chromium`` (never a browser Playwright downloads).
On a machine without either the tests skip with the reason; under CI (``CI`` set) they fail
instead, because ``.ci/run`` installs the browser and ``make install`` the package.
"""

from __future__ import annotations

import os
import re
import shutil
import urllib.error
import urllib.request

import pytest
from django.db import connections

from ingestion.documents import admit_document
from ingestion.models import CompilationJob, RunState
from knowledgefs.testing.fixtures import compile_all
from spaces.api_keys import create_api_key, revoke_api_key
from spaces.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PASSWORD = "correct horse battery staple"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI installs it (.ci/run, make install)")
    pytest.skip(reason)


@pytest.fixture
def page(monkeypatch, live_server):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (make install)")
    if not os.path.exists(CHROMIUM):
        _unavailable("no chromium binary (make chromium)")
    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes
    # between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        page = browser.new_page()
        page.set_default_timeout(20_000)
        yield page
        browser.close()
        # While that loop runs, Django keeps this thread's database connections apart (asgiref
        # stores them per async context), so the test body used connections of its own: close
        # them here, or PostgreSQL refuses to drop the test database still in use.
        connections.close_all()


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_superuser("operator", "op@example.com", PASSWORD)


def log_in(page, live_server) -> None:
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")


def jobs_list(page, live_server) -> None:
    page.goto(f"{live_server.url}/admin/ingestion/compilationjob/")


def apply_filter(page, title: str, choice: str) -> None:
    page.locator(f'#changelist-filter details[data-filter-title="{title}"] a').filter(
        has_text=choice
    ).first.click()
    page.wait_for_load_state()


def row(page, filename: str):
    return page.locator("#result_list tbody tr").filter(has_text=filename)


def run_action(page, filename: str, action: str) -> None:
    row(page, filename).locator("input.action-select").check()
    page.select_option("#changelist-form select[name=action]", action)
    page.click('#changelist-form button[name="index"]')
    page.wait_for_load_state()


def test_an_operator_retries_a_failed_job_and_reads_its_attempt_history(
    page, live_server, operator, space
):
    # Whitespace-only text is admitted, then fails to compile with no_extractable_text.
    failed = admit_document(space, filename="blank.txt", data=b"  \n\t\n", enqueue=False).job
    compile_all()
    assert CompilationJob.objects.get(id=failed.id).run_state == RunState.FAILED

    log_in(page, live_server)
    jobs_list(page, live_server)
    apply_filter(page, "run state", "Failed")
    assert "run_state__exact=failed" in page.url
    failed_row = row(page, "blank.txt")
    assert failed_row.count() == 1
    assert failed_row.locator("td.field-error_column span").get_attribute("title")
    assert "no_extractable_text" in failed_row.inner_text()

    run_action(page, "blank.txt", "retry_jobs")
    success = page.locator("ul.messagelist li.success")
    assert "Queued a new attempt for 1 job." in success.inner_text()

    retry = CompilationJob.objects.get(retry_of_id=failed.id)
    jobs_list(page, live_server)
    apply_filter(page, "run state", "Queued")
    queued_row = row(page, "blank.txt")
    assert queued_row.count() == 1
    assert queued_row.locator("td.field-run_state_column").inner_text() == "Queued"
    assert "#2" in queued_row.locator("td.field-attempts").inner_text()

    # The retry's page lists both attempts, each linking to the other's page.
    queued_row.locator("th.field-document_filename a").click()
    page.wait_for_url(re.compile(f"/compilationjob/{retry.id}/change/"))
    history = page.locator("table.attempt-history tbody tr")
    assert history.count() == 2
    first, second = (history.nth(i).locator("td").all_inner_texts() for i in (0, 1))
    assert (first[1], first[3], first[4]) == ("1", "Failed", "no_extractable_text")
    assert (second[1], second[3]) == ("2", "Queued")
    assert "(this job)" in history.nth(1).inner_text()
    history.nth(0).locator("a").click()
    page.wait_for_url(re.compile(f"/compilationjob/{failed.id}/change/"))
    assert page.locator("table.attempt-history tbody tr").count() == 2


def test_an_operator_cancels_a_queued_job(page, live_server, operator, space):
    admitted = admit_document(space, filename="notes.md", data=b"# Notes\n\nText.", enqueue=False)

    log_in(page, live_server)
    jobs_list(page, live_server)
    apply_filter(page, "run state", "Queued")
    run_action(page, "notes.md", "cancel_jobs")
    assert "Canceled 1 job." in page.locator("ul.messagelist li.success").inner_text()

    jobs_list(page, live_server)
    apply_filter(page, "run state", "Canceled")
    assert row(page, "notes.md").locator("td.field-run_state_column").inner_text() == "Canceled"
    assert CompilationJob.objects.get(id=admitted.job.id).run_state == RunState.CANCELED

    # Canceling it again is refused by the service and reported as a warning naming the job.
    run_action(page, "notes.md", "cancel_jobs")
    warning = page.locator("ul.messagelist li.warning").inner_text()
    assert str(admitted.job.id) in warning and "notes.md" in warning


# --- API keys ---------------------------------------------------------------------------------


def api_status(live_server, secret: str) -> int:
    """Status of ``GET /v1/knowledge-spaces`` with this key, over HTTP to the live server."""
    request = urllib.request.Request(
        f"{live_server.url}/v1/knowledge-spaces", headers={"Authorization": f"Bearer {secret}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_an_operator_revokes_an_api_key_and_the_api_refuses_it_at_once(
    page, live_server, operator, tenant, space
):
    key, secret = create_api_key(tenant, spaces=[space], name="reporting")
    old, _ = create_api_key(tenant, name="retired")
    revoke_api_key(old)
    assert api_status(live_server, secret) == 200  # the server's cache now holds the key

    log_in(page, live_server)
    page.goto(f"{live_server.url}/admin/spaces/apikey/")
    apply_filter(page, "state", "Active")
    assert "state=active" in page.url
    assert row(page, key.prefix).count() == 1
    assert row(page, old.prefix).count() == 0
    assert "1 bound" in row(page, key.prefix).inner_text()
    assert secret not in page.content()

    run_action(page, key.prefix, "revoke")
    assert "Revoked 1 API keys" in page.locator("ul.messagelist li.success").inner_text()
    assert ApiKey.objects.get(id=key.id).revoked_at is not None
    assert api_status(live_server, secret) == 401

    apply_filter(page, "state", "Revoked")
    assert row(page, key.prefix).count() == 1
    assert row(page, old.prefix).count() == 1


# --- the job page's buttons and the lists at 1500 px -------------------------------------------


def test_an_operator_retries_and_cancels_from_the_job_page(page, live_server, operator, space):
    failed = admit_document(space, filename="blank.txt", data=b"  \n\t\n", enqueue=False).job
    compile_all()
    failed = CompilationJob.objects.get(id=failed.id)
    assert (failed.run_state, failed.error_retryable) == (RunState.FAILED, False)

    log_in(page, live_server)
    page.goto(f"{live_server.url}/admin/ingestion/compilationjob/{failed.id}/change/")
    # a failed job's page: retryable says no, progress is a bar
    assert page.locator(".field-retryable img[alt=False]").count() == 1
    assert page.locator(".kfs-progress progress").count() == 1
    page.locator(".object-tools button", has_text="Retry").click()
    page.wait_for_load_state()
    assert re.search(f"/compilationjob/{failed.id}/change/$", page.url)
    assert (
        "Queued a new attempt for 1 job." in page.locator("ul.messagelist li.success").inner_text()
    )
    warning = page.locator("ul.messagelist li.warning").inner_text()
    assert "no_extractable_text is terminal (not retryable)" in warning
    retry = CompilationJob.objects.get(retry_of_id=failed.id)
    assert retry.run_state == RunState.QUEUED

    # the new attempt's page: still live, so retryable is "—"; Cancel stops it
    page.locator("table.attempt-history a", has_text=str(retry.id)).click()
    page.wait_for_url(re.compile(f"/compilationjob/{retry.id}/change/"))
    assert page.locator(".field-retryable .readonly").inner_text().strip() == "—"
    page.locator(".object-tools button", has_text="Cancel").click()
    page.wait_for_load_state()
    assert "Canceled 1 job." in page.locator("ul.messagelist li.success").inner_text()
    assert CompilationJob.objects.get(id=retry.id).run_state == RunState.CANCELED
    # pressed again: the service's refusal, as a warning naming the job
    page.locator(".object-tools button", has_text="Cancel").click()
    page.wait_for_load_state()
    assert str(retry.id) in page.locator("ul.messagelist li.warning").inner_text()


def test_long_filenames_keep_every_column_of_the_lists_on_screen_at_1500_px(
    page, live_server, operator, space, tmp_path
):
    name = "Quarterly financial statements of the northern region " * 4 + "(final).txt"
    long = admit_document(space, filename=name, data=b"Some text.", enqueue=False).job
    admit_document(space, filename="short.txt", data=b"Other text.", enqueue=False)
    CompilationJob.objects.filter(id=long.id).update(  # the widest error code too
        run_state=RunState.FAILED, error_code="parser_memory_exceeded"
    )
    page.set_viewport_size({"width": 1500, "height": 900})
    log_in(page, live_server)
    for url, last in [
        ("/admin/ingestion/compilationjob/", "td.field-updated"),
        ("/admin/ingestion/document/", "td.field-created_at"),
    ]:
        page.goto(f"{live_server.url}{url}")
        shot = tmp_path / (url.strip("/").replace("/", "-") + ".png")
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 0
        # The list's box scrolls sideways when its table is wider: it must not have to.
        results = page.locator("#changelist-form .results")
        widths = results.evaluate("e => [e.scrollWidth, e.clientWidth]")
        assert widths[0] <= widths[1], (url, widths)
        box = results.bounding_box()
        cell = row(page, "Quarterly").locator(last).bounding_box()
        assert cell["x"] + cell["width"] <= box["x"] + box["width"] + 1, (url, cell, box)
        ellipsis = row(page, "Quarterly").locator("th .kfs-ellipsis")
        assert ellipsis.get_attribute("title") == name
        box = ellipsis.bounding_box()
        assert box["width"] < 400, box  # cut, not 2000 px of filename
        assert ellipsis.evaluate("e => e.scrollWidth > e.clientWidth")  # an ellipsis shows
        assert page.evaluate("document.documentElement.scrollWidth") <= 1500
