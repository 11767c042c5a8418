"""Workspace cutover ledger: compare-and-set steps, rollback, re-cutover and the runtime gate on
real product routes (spec §5.5 cases 28-30)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from knowledgefs.errors import ServiceError
from upgrades.models import SWITCHES, WorkspaceCutoverLedger
from upgrades.services import cutover

pytestmark = pytest.mark.django_db

SPACES = "/v1/knowledge-spaces"


def freeze_ack(ledger, **changes) -> dict:
    ack = {
        "tenant_id": ledger.tenant_id,
        "ledger_cas_version": ledger.cas_version,
        "freeze_id": "freeze-7f3a",
        "freeze_revision": 1,
    }
    return {**ack, **changes}


def activation_ack(ledger, revision: int = 1, **changes) -> dict:
    ack = {
        "tenant_id": ledger.tenant_id,
        "ledger_cas_version": ledger.cas_version,
        "activation_id": f"activation-{revision}",
        "activation_revision": revision,
    }
    return {**ack, **changes}


def step(ledger, to_phase, **kwargs):
    return cutover.advance(
        ledger.tenant_id,
        expected_phase=ledger.phase,
        expected_cas_version=ledger.cas_version,
        to_phase=to_phase,
        **kwargs,
    )


def frozen(tenant: str):
    ledger, created = cutover.create_ledger(tenant)
    assert created and (ledger.phase, ledger.cas_version) == ("inventory", 0)
    ledger = step(ledger, "backfill")
    ledger = step(ledger, "shadow")
    return step(ledger, "frozen", ack=freeze_ack(ledger))


def cut_over(tenant: str):
    ledger = frozen(tenant)
    return step(ledger, "cutover", ack=activation_ack(ledger))


def observing(tenant: str):
    ledger = cut_over(tenant)
    smoke = {"checks": [{"name": "retrieval", "passed": True}]}
    return step(ledger, "observing", smoke_results=smoke)


def ready(tenant: str):
    ledger = observing(tenant)
    later = max(ledger.observation_ends_at, ledger.maximum_task_expires_at)
    return step(ledger, "ready_for_cleanup", now=later + dt.timedelta(seconds=1))


def refused(call, code: str) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        call()
    assert caught.value.code == code, caught.value.message
    return caught.value


def snapshot(tenant: str) -> dict:
    return WorkspaceCutoverLedger.objects.filter(tenant_id=tenant).values().get()


# --- case 28 ----------------------------------------------------------------------------------


def test_cutover_turns_all_switches_and_evidence_on_in_one_update(tenant):
    ledger = frozen(tenant)
    assert (ledger.phase, ledger.cas_version) == ("frozen", 3)
    assert not any(getattr(ledger, name) for name in SWITCHES)
    assert cutover.workspace_gate(tenant).code == "not_cut_over"

    with CaptureQueriesContext(connection) as queries:
        after = step(ledger, "cutover", ack=activation_ack(ledger))
    updates = [
        q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE")
    ]
    assert len(updates) == 1 and "upgrade_cutover_ledger" in updates[0]
    for column in (*SWITCHES, "activation_id", "activation_revision", "cutover_at"):
        assert column in updates[0]
    assert (after.phase, after.cas_version) == ("cutover", 4)
    assert all(getattr(after, name) for name in SWITCHES)
    assert (after.activation_id, after.activation_revision) == ("activation-1", 1)
    assert after.activation_ledger_cas_version == 3
    assert after.rollback_cutoff_at > after.cutover_at
    assert cutover.workspace_gate(tenant) == (True, "open", "cut over (phase cutover)")


def test_a_stale_version_or_phase_changes_nothing(tenant):
    ledger = frozen(tenant)
    before = snapshot(tenant)
    error = refused(
        lambda: cutover.advance(
            tenant,
            expected_phase="frozen",
            expected_cas_version=2,
            to_phase="cutover",
            ack=activation_ack(ledger),
        ),
        "stale_version",
    )
    assert error.status == 409 and error.details == {"phase": "frozen", "cas_version": 3}
    refused(
        lambda: cutover.advance(
            tenant, expected_phase="shadow", expected_cas_version=3, to_phase="frozen"
        ),
        "stale_version",
    )
    # A concurrent writer moved the row between our read and our UPDATE: the UPDATE matches
    # nothing and reports the version it lost to.
    WorkspaceCutoverLedger.objects.filter(tenant_id=tenant).update(cas_version=9)
    refused(lambda: cutover._cut_over(ledger, ack=activation_ack(ledger), smoke_results=None,
                                      now=timezone.now()), "stale_version")  # fmt: skip
    assert snapshot(tenant) == {**before, "cas_version": 9}


@pytest.mark.parametrize(
    ("ack", "code"),
    [
        (None, "invalid_ack"),
        ("activation-1", "invalid_ack"),
        ({}, "invalid_ack"),
        ({"extra": 1}, "invalid_ack"),
        ({"activation_revision": "1"}, "invalid_ack"),
        ({"activation_revision": 0}, "invalid_ack"),
        ({"activation_revision": True}, "invalid_ack"),
        ({"activation_id": ""}, "invalid_ack"),
        ({"activation_id": "a\nb"}, "invalid_ack"),
        ({"ledger_cas_version": -1}, "invalid_ack"),
        ({"ledger_cas_version": 10**40}, "invalid_ack"),
        ({"activation_revision": 10**40}, "invalid_ack"),
        ({"activation_revision": 2**63}, "invalid_ack"),
        ({"tenant_id": "tenant-b"}, "ack_mismatch"),
        ({"ledger_cas_version": 2}, "ack_mismatch"),
        ({"ledger_cas_version": 4}, "ack_mismatch"),
    ],
)
def test_malformed_or_mismatched_activation_acks_change_nothing(tenant, ack, code):
    ledger = frozen(tenant)
    if isinstance(ack, dict) and ack and "extra" not in ack:
        ack = activation_ack(ledger, **ack)
    elif isinstance(ack, dict) and "extra" in ack:
        ack = {**activation_ack(ledger), **ack}
    before = snapshot(tenant)
    error = refused(lambda: step(ledger, "cutover", ack=ack), code)
    assert error.status == (400 if code == "invalid_ack" else 409)
    assert snapshot(tenant) == before


def test_freeze_needs_its_own_ack_and_steps_go_one_phase_forward(tenant):
    ledger, _ = cutover.create_ledger(tenant)
    assert cutover.create_ledger(tenant) == (ledger, False)
    refused(lambda: step(ledger, "shadow"), "invalid_transition")
    ledger = step(step(ledger, "backfill"), "shadow")
    before = snapshot(tenant)
    refused(lambda: step(ledger, "frozen"), "invalid_ack")
    refused(lambda: step(ledger, "frozen", ack=activation_ack(ledger)), "invalid_ack")
    zero = freeze_ack(ledger, freeze_revision=0)
    refused(lambda: step(ledger, "frozen", ack=zero), "invalid_ack")
    assert snapshot(tenant) == before
    ledger = step(ledger, "frozen", ack=freeze_ack(ledger))
    assert (ledger.remote_freeze_id, ledger.remote_freeze_revision) == ("freeze-7f3a", 1)
    assert ledger.freeze_at == ledger.remote_freeze_acked_at


def test_observing_needs_passed_smoke_checks_and_ready_needs_the_windows(tenant):
    ledger = cut_over(tenant)
    failing = {"checks": [{"name": "retrieval", "passed": True}, {"name": "acl", "passed": False}]}
    assert "acl" in refused(lambda: step(ledger, "observing", smoke_results=failing),
                            "smoke_checks_failed").message  # fmt: skip
    refused(lambda: step(ledger, "observing", smoke_results={"checks": []}),
            "invalid_smoke_results")  # fmt: skip
    ledger = step(ledger, "observing", smoke_results={"checks": [{"name": "q", "passed": True}]})
    assert ledger.smoke_results == {"checks": [{"name": "q", "passed": True}]}
    assert ledger.observation_ends_at - ledger.observation_started_at == dt.timedelta(days=1)
    refused(lambda: step(ledger, "ready_for_cleanup"), "observation_not_elapsed")
    refused(
        lambda: step(ledger, "ready_for_cleanup", now=ledger.observation_ends_at),
        "task_ttl_not_elapsed",
    )
    ledger = step(ledger, "ready_for_cleanup", now=ledger.maximum_task_expires_at)
    assert ledger.phase == "ready_for_cleanup" and cutover.workspace_gate(tenant).open


# --- case 29 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("reach", [cut_over, observing, ready])
def test_rollback_keeps_the_evidence_and_closes_product_routes(tenant, reach):
    ledger = reach(tenant)
    phase = ledger.phase
    rolled = cutover.rollback(tenant, expected_phase=phase, expected_cas_version=ledger.cas_version)
    assert (rolled.phase, rolled.cas_version) == ("frozen", ledger.cas_version + 1)
    assert rolled.rolled_back_at is not None and not rolled.product_routes_enabled
    for kept in (
        "capability_v2_enabled",
        "integrated_mode_enabled",
        "legacy_acl_read_only",
        "activation_id",
        "activation_revision",
        "activation_acked_at",
        "remote_freeze_id",
        "cutover_at",
        "rollback_cutoff_at",
    ):
        assert getattr(rolled, kept) == getattr(ledger, kept), kept
    state = cutover.workspace_gate(tenant)
    assert (state.open, state.code) == (False, "rolled_back")


def test_rollback_is_refused_after_the_cutoff_and_after_irreversible_cleanup(tenant):
    ledger = observing(tenant)
    before = snapshot(tenant)
    kwargs = {"expected_phase": "observing", "expected_cas_version": ledger.cas_version}
    refused(lambda: cutover.rollback(tenant, **kwargs, now=ledger.rollback_cutoff_at),
            "rollback_cutoff_passed")  # fmt: skip
    WorkspaceCutoverLedger.objects.filter(tenant_id=tenant).update(
        irreversible_cleanup_at=timezone.now()
    )
    refused(lambda: cutover.rollback(tenant, **kwargs), "irreversible_cleanup_started")
    refused(
        lambda: cutover.rollback(tenant, expected_phase="observing", expected_cas_version=1),
        "stale_version",
    )
    after = snapshot(tenant)
    assert after["phase"] == "observing" and after["cas_version"] == before["cas_version"]
    assert after["rolled_back_at"] is None and after["product_routes_enabled"]


def test_frozen_and_earlier_phases_cannot_be_rolled_back(tenant):
    ledger = frozen(tenant)
    refused(
        lambda: cutover.rollback(tenant, expected_phase="frozen", expected_cas_version=3),
        "rollback_not_allowed",
    )
    assert snapshot(tenant)["cas_version"] == ledger.cas_version


# --- case 30 ----------------------------------------------------------------------------------


def test_cutover_rollback_cutover_on_a_real_product_route(client, tenant, space):
    other = cutover.create_ledger("tenant-native-neighbour")[0]
    assert other.phase == "inventory"
    assert client.get(SPACES).status_code == 200  # no ledger: a native tenant

    ledger = frozen(tenant)
    closed = client.get(SPACES)
    assert closed.status_code == 409
    assert closed.json()["code"] == "workspace_cutover_closed"
    assert "phase frozen" in closed.json()["message"]
    assert closed.json()["details"] == {"gate": "not_cut_over"}

    ledger = step(ledger, "cutover", ack=activation_ack(ledger, revision=1))
    assert client.get(SPACES).status_code == 200
    assert client.get(f"{SPACES}/{space.id}").status_code == 200

    ledger = cutover.rollback(tenant, expected_phase="cutover", expected_cas_version=4)
    between = client.get(f"{SPACES}/{space.id}")
    assert between.status_code == 409
    body = between.json()
    assert (body["code"], body["details"]) == ("workspace_cutover_closed", {"gate": "rolled_back"})
    assert "rolled back" in body["message"]
    assert cutover.workspace_gate(tenant).code == "rolled_back"

    # The recorded activation revision is 1: the same ack again is a mismatch, nothing moves.
    refused(
        lambda: cutover.recutover(
            tenant, expected_cas_version=5, ack=activation_ack(ledger, revision=1)
        ),
        "ack_mismatch",
    )
    assert client.get(SPACES).status_code == 409
    again = cutover.recutover(
        tenant, expected_cas_version=5, ack=activation_ack(ledger, revision=2)
    )
    assert (again.phase, again.cas_version, again.rolled_back_at) == ("cutover", 6, None)
    assert again.product_routes_enabled and again.activation_revision == 2
    assert cutover.workspace_gate(tenant) == (True, "open", "cut over (phase cutover)")
    assert client.get(SPACES).status_code == 200
    assert client.get(f"{SPACES}/{space.id}").status_code == 200


def test_integers_beyond_the_bigint_columns_are_400_and_change_nothing(tenant):
    ledger = step(step(cutover.create_ledger(tenant)[0], "backfill"), "shadow")
    before = snapshot(tenant)
    huge = freeze_ack(ledger, freeze_revision=10**40)
    assert (
        "9223372036854775807"
        in refused(lambda: step(ledger, "frozen", ack=huge), "invalid_ack").message
    )
    for version in (10**40, -1):
        error = refused(
            lambda v=version: cutover.advance(
                tenant, expected_phase="shadow", expected_cas_version=v, to_phase="frozen"
            ),
            "invalid_version",
        )
        assert error.status == 400
    refused(lambda: cutover.recutover(tenant, expected_cas_version=10**30, ack={}),
            "invalid_version")  # fmt: skip
    assert snapshot(tenant) == before
    ledger = step(ledger, "frozen", ack=freeze_ack(ledger, freeze_revision=2**63 - 1))
    assert ledger.remote_freeze_revision == 2**63 - 1


def test_steps_that_take_nothing_name_the_field_they_were_given(tenant):
    ledger = step(cutover.create_ledger(tenant)[0], "backfill")
    smoke = {"checks": [{"name": "q", "passed": True}]}
    error = refused(lambda: step(ledger, "shadow", smoke_results=smoke), "invalid_smoke_results")
    assert error.message == "the step to shadow takes no smoke_results"
    error = refused(lambda: step(ledger, "shadow", ack=freeze_ack(ledger)), "invalid_ack")
    assert error.message == "the step to shadow takes no ack"


def test_recutover_of_a_workspace_never_rolled_back_is_not_rolled_back_in_any_phase(tenant):
    ledger = cut_over(tenant)
    error = refused(
        lambda: cutover.recutover(
            tenant, expected_cas_version=ledger.cas_version, ack=activation_ack(ledger)
        ),
        "not_rolled_back",
    )
    assert error.status == 409


def test_recutover_needs_a_rollback_and_advance_from_frozen_also_clears_it(tenant):
    ledger = frozen(tenant)
    refused(
        lambda: cutover.recutover(tenant, expected_cas_version=3, ack=activation_ack(ledger)),
        "not_rolled_back",
    )
    ledger = step(ledger, "cutover", ack=activation_ack(ledger))
    ledger = cutover.rollback(tenant, expected_phase="cutover", expected_cas_version=4)
    with CaptureQueriesContext(connection) as queries:
        again = step(ledger, "cutover", ack=activation_ack(ledger, revision=3))
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 1 and "rolled_back_at" in updates[0]  # cleared in the same CAS
    assert again.rolled_back_at is None and cutover.workspace_gate(tenant).open


def test_a_switch_turned_off_closes_the_gate(client, tenant):
    cut_over(tenant)
    WorkspaceCutoverLedger.objects.filter(tenant_id=tenant).update(integrated_mode_enabled=False)
    state = cutover.workspace_gate(tenant)
    assert (state.open, state.code) == (False, "switch_off")
    assert "integrated_mode_enabled" in state.reason
    assert client.get(SPACES).json()["details"] == {"gate": "switch_off"}


def test_the_database_refuses_rows_that_break_the_evidence_rules(tenant):
    from django.db import IntegrityError, transaction

    ledger = frozen(tenant)
    rows = WorkspaceCutoverLedger.objects.filter(id=ledger.id)
    for bad in (
        {"remote_freeze_revision": None},  # freeze evidence half set
        {"activation_id": "x"},  # activation evidence half set
        {"cutover_at": timezone.now(), "freeze_at": None, "remote_freeze_id": None,
         "remote_freeze_revision": None, "remote_freeze_acked_at": None, "phase": "shadow"},
        {"rollback_cutoff_at": timezone.now()},  # cutoff without cutover
        {"cas_version": -1},
        {"phase": "cutover"},  # cut over without activation evidence
    ):  # fmt: skip
        with pytest.raises(IntegrityError), transaction.atomic():
            rows.update(**bad)
