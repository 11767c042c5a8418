"""``manage.py kfs cutover``: the ledger and its gate from the command line."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from upgrades.tests.test_cutover import cut_over

pytestmark = pytest.mark.django_db


def kfs(*args: str) -> dict:
    out = StringIO()
    call_command("kfs", "cutover", *args, stdout=out)
    return json.loads(out.getvalue())


def test_show_rollback_and_recutover_from_the_command_line(tenant):
    with pytest.raises(CommandError, match="ledger_not_found"):
        kfs("show", tenant)
    cut_over(tenant)
    shown = kfs("show", tenant)
    assert (shown["phase"], shown["cas_version"], shown["gate"]["open"]) == ("cutover", 4, True)

    with pytest.raises(CommandError, match="stale_version"):
        kfs("rollback", tenant, "--expected-phase", "cutover", "--expected-version", "3")
    rolled = kfs("rollback", tenant, "--expected-phase", "cutover", "--expected-version", "4")
    assert rolled["phase"] == "frozen" and rolled["gate"]["code"] == "rolled_back"

    with pytest.raises(CommandError, match="invalid_json"):
        kfs("recutover", tenant, "--expected-version", "5", "--ack", "{not json")
    ack = {"tenant_id": tenant, "ledger_cas_version": 5, "activation_id": "a-2",
           "activation_revision": 2}  # fmt: skip
    again = kfs("recutover", tenant, "--expected-version", "5", "--ack", json.dumps(ack))
    assert (again["rolled_back_at"], again["gate"]["code"]) == (None, "open")


def test_advance_from_the_command_line(tenant):
    from upgrades.services import cutover

    cutover.create_ledger(tenant)
    step = kfs("advance", tenant, "--to", "backfill", "--expected-phase", "inventory",
               "--expected-version", "0")  # fmt: skip
    assert (step["phase"], step["cas_version"]) == ("backfill", 1)
    with pytest.raises(CommandError, match="invalid_transition"):
        kfs("advance", tenant, "--to", "frozen", "--expected-phase", "backfill",
            "--expected-version", "1")  # fmt: skip
