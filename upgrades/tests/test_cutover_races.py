"""Compare-and-set races on the cutover ledger, with two real threads and two database
connections (PostgreSQL: SQLite serialises writers on its one file lock and proves nothing)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from knowledgefs.errors import ServiceError
from upgrades.models import CleanupAuthorization, WorkspaceCutoverLedger
from upgrades.services import cleanup, cutover
from upgrades.tests.test_cutover import activation_ack, frozen, ready

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("row-level races need PostgreSQL (scripts/with_postgres.py)")


def race(*calls) -> list:
    """Run the calls at once in threads; each result is the return value or the ServiceError."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(index, call):
        try:
            barrier.wait(timeout=10)
            results[index] = call()
        except ServiceError as exc:
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_two_activations_at_one_version_commit_exactly_once(tenant):
    for round_ in range(5):
        tenant_id = f"{tenant}-{round_}"
        ledger = frozen(tenant_id)

        def activate(revision, ledger=ledger, tenant_id=tenant_id):
            return cutover.advance(
                tenant_id,
                expected_phase="frozen",
                expected_cas_version=3,
                to_phase="cutover",
                ack=activation_ack(ledger, revision=revision),
            )

        results = race(lambda: activate(1), lambda: activate(2))
        winners = [r for r in results if isinstance(r, WorkspaceCutoverLedger)]
        losers = [r for r in results if isinstance(r, ServiceError)]
        assert len(winners) == 1 and len(losers) == 1, results
        assert losers[0].code == "stale_version"
        stored = WorkspaceCutoverLedger.objects.get(tenant_id=tenant_id)
        assert (stored.phase, stored.cas_version) == ("cutover", 4)
        assert stored.activation_revision == winners[0].activation_revision


def test_rollback_and_cleanup_start_never_both_win(tenant):
    for round_ in range(5):
        tenant_id = f"{tenant}-{round_}"
        ledger = ready(tenant_id)
        found = cleanup.request_cleanup(tenant_id, requested_by="alice")
        found = cleanup.approve(found.id, expected_row_version=0, approved_by="bob")
        results = race(
            lambda t=tenant_id, v=ledger.cas_version: cutover.rollback(
                t, expected_phase="ready_for_cleanup", expected_cas_version=v
            ),
            lambda f=found: cleanup.start(
                f.id, expected_row_version=1, started_by="bob", evidence={"ticket": "OPS-1"}
            ),
        )
        rolled, started = results
        stored = WorkspaceCutoverLedger.objects.get(tenant_id=tenant_id)
        authorization = CleanupAuthorization.objects.get(id=found.id)
        if isinstance(rolled, WorkspaceCutoverLedger):
            assert isinstance(started, ServiceError), results
            assert started.code in ("ledger_not_ready", "stale_version")
            assert stored.phase == "frozen" and stored.irreversible_cleanup_at is None
            assert authorization.status == "approved"
        else:
            assert isinstance(started, CleanupAuthorization), results
            assert rolled.code in ("stale_version", "irreversible_cleanup_started")
            assert stored.phase == "ready_for_cleanup" and stored.rolled_back_at is None
            assert stored.irreversible_cleanup_at is not None
            assert authorization.status == "started"
            assert authorization.started_ledger_cas_version == stored.cas_version
