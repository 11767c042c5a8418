"""Cleanup authorizations and cutover ledgers in a real headless browser (Debian's chromium,
like tests/system/test_admin_browser.py): operator A requests a cleanup, A's own approval is refused
with the four-eyes message, operator B approves, starts and completes it; the ledger list shows
each workspace's runtime gate."""

from __future__ import annotations

import pytest

from tests.system.test_admin_browser import PASSWORD, page  # noqa: F401  (the browser fixture)
from upgrades.models import CleanupAuthorization, WorkspaceCutoverLedger
from upgrades.services import cutover
from upgrades.tests.test_cutover import cut_over, ready

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operators(django_user_model):
    for name in ("operator-a", "operator-b"):
        django_user_model.objects.create_superuser(name, f"{name}@example.com", PASSWORD)


def log_in(page, live_server, username: str) -> None:  # noqa: F811
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")


def log_out(page, live_server) -> None:  # noqa: F811
    page.goto(f"{live_server.url}/admin/")
    page.click("#logout-form button")
    page.wait_for_load_state()


def run_action(page, tenant: str, action: str) -> None:  # noqa: F811
    page.goto(page.url.split("?")[0])
    page.locator("#result_list tbody tr").filter(has_text=tenant).locator(
        "input.action-select"
    ).check()
    page.select_option("#changelist-form select[name=action]", action)
    page.click('#changelist-form button[name="index"]')
    page.wait_for_load_state()


def test_four_eyes_cleanup_and_the_gate_column(page, live_server, operators, tenant):  # noqa: F811
    ready(tenant)
    cut_over("tenant-rolled")
    cutover.rollback("tenant-rolled", expected_phase="cutover", expected_cas_version=4)
    authorizations = f"{live_server.url}/admin/upgrades/cleanupauthorization/"

    log_in(page, live_server, "operator-a")
    page.goto(authorizations + "add/")
    page.select_option(
        "#id_ledger", label=str(WorkspaceCutoverLedger.objects.get(tenant_id=tenant))
    )
    page.fill("#id_reason", "legacy datasets are no longer read")
    page.click("input[name=_save]")
    page.wait_for_url(authorizations)
    row = page.locator("#result_list tbody tr").filter(has_text=tenant)
    assert "operator-a" in row.inner_text() and "Requested" in row.inner_text()

    run_action(page, tenant, "approve_authorizations")
    error = page.locator("ul.messagelist li.error").inner_text()
    assert "four_eyes_required" in error
    assert "operator-a requested this cleanup; another operator must approve it" in error
    assert CleanupAuthorization.objects.get().status == "requested"
    log_out(page, live_server)

    log_in(page, live_server, "operator-b")
    page.goto(authorizations)
    run_action(page, tenant, "approve_authorizations")
    assert (
        "Approved the cleanup of tenant-a (now approved"
        in page.locator("ul.messagelist li.success").inner_text()
    )
    run_action(page, tenant, "start_cleanups")
    assert "now started" in page.locator("ul.messagelist li.success").inner_text()
    run_action(page, tenant, "complete_cleanups")
    assert "now completed" in page.locator("ul.messagelist li.success").inner_text()
    done = CleanupAuthorization.objects.get()
    assert (done.requested_by, done.approved_by, done.status) == (
        "operator-a",
        "operator-b",
        "completed",
    )
    assert "Completed" in page.locator("#result_list tbody tr").first.inner_text()

    page.goto(f"{live_server.url}/admin/upgrades/workspacecutoverledger/")
    ours = page.locator("#result_list tbody tr").filter(has_text=tenant)
    assert ours.locator("td.field-gate").inner_text() == "open"
    assert ours.locator("td.field-irreversible_cleanup_at").inner_text() != "-"
    rolled = page.locator("#result_list tbody tr").filter(has_text="tenant-rolled")
    assert rolled.locator("td.field-gate").inner_text().startswith("closed: rolled_back")
    assert "frozen" in rolled.inner_text()
