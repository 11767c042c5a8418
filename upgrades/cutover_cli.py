"""``manage.py kfs cutover show|advance|rollback|recutover TENANT``: the operator's view of a
workspace's cutover ledger. Each action is one call to :mod:`upgrades.services.cutover`; the
answer is the ledger with its runtime gate, as JSON."""

from __future__ import annotations

import json
from typing import Any

from knowledgefs.errors import InvalidInput

from .models import CutoverPhase
from .services import cutover


def add_parser(sub) -> None:
    """Register ``cutover`` on the ``kfs`` subcommand parser ``sub``."""
    parser = sub.add_parser("cutover", help="show or move a workspace's cutover ledger")
    actions = parser.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="the ledger and its runtime gate")
    show.add_argument("tenant")
    phases = CutoverPhase.values
    advance = actions.add_parser("advance", help="one forward step (compare-and-set)")
    advance.add_argument("tenant")
    advance.add_argument("--to", dest="to_phase", required=True, choices=phases)
    advance.add_argument("--expected-phase", required=True, choices=phases)
    advance.add_argument("--expected-version", type=int, required=True)
    advance.add_argument("--ack", help="the remote freeze or activation ack, as JSON")
    advance.add_argument("--smoke", help='smoke results, as JSON: {"checks": [...]}')
    rollback = actions.add_parser("rollback", help="roll a cut-over workspace back to frozen")
    rollback.add_argument("tenant")
    rollback.add_argument("--expected-phase", required=True, choices=phases)
    rollback.add_argument("--expected-version", type=int, required=True)
    recut = actions.add_parser("recutover", help="cut a rolled-back workspace over again")
    recut.add_argument("tenant")
    recut.add_argument("--expected-version", type=int, required=True)
    recut.add_argument("--ack", required=True, help="the activation ack, as JSON")


def _json(text: str | None, option: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"{option} is not valid JSON: {exc}", code="invalid_json") from None


def run(options: dict) -> dict:
    """Carry out one ``kfs cutover`` action; returns the ledger as a dict (service errors
    propagate with their codes)."""
    tenant, action = options["tenant"], options["action"]
    if action == "show":
        ledger = cutover.get_ledger(tenant)
    elif action == "advance":
        ledger = cutover.advance(
            tenant,
            expected_phase=options["expected_phase"],
            expected_cas_version=options["expected_version"],
            to_phase=options["to_phase"],
            ack=_json(options["ack"], "--ack"),
            smoke_results=_json(options["smoke"], "--smoke"),
        )
    elif action == "rollback":
        ledger = cutover.rollback(
            tenant,
            expected_phase=options["expected_phase"],
            expected_cas_version=options["expected_version"],
        )
    else:
        ledger = cutover.recutover(
            tenant,
            expected_cas_version=options["expected_version"],
            ack=_json(options["ack"], "--ack"),
        )
    return cutover.ledger_as_dict(ledger)
