"""The per-workspace cutover ledger: forward steps, rollback, re-cutover and the runtime gate.

Every transition is **one** compare-and-set UPDATE on (``tenant_id``, expected ``phase``,
expected ``cas_version``) that increments ``cas_version`` and writes an explicit value for every
column it changes, NULL included (a value of ``None`` in the write set is written as NULL: the
"clear" semantics the reference writer lacked, so a re-cutover really clears
``rolled_back_at``). The step's gates are checked on the row read just before, and the time
gates again in the UPDATE's WHERE clause; if the row moved in between, nothing is written and
the caller gets ``stale_version`` with the current phase and version.

Dify makes the remote calls (freeze, activation) itself, outside any transaction of ours, and
reports their acknowledgements here. Ack shapes (exactly these members, nothing else):

* freeze ack: ``{"tenant_id": str, "ledger_cas_version": int, "freeze_id": str,
  "freeze_revision": int}``;
* activation ack: ``{"tenant_id": str, "ledger_cas_version": int, "activation_id": str,
  "activation_revision": int}``.

``tenant_id`` must be the ledger's, ``ledger_cas_version`` the expected version the step is
taken at (the version Dify read before calling the remote), ids 1-128 printable ASCII,
revisions ≥ 1; an activation revision must exceed the last one recorded (a retry after a lost
race asks the remote again with a higher revision). A malformed ack is 400 ``invalid_ack``, a
mismatched one 409 ``ack_mismatch``; neither changes anything.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple, Protocol

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from knowledgefs.auth.gates import Refusal
from knowledgefs.errors import Conflict, InvalidInput, NotFound
from spaces.services import validate_tenant_id

from ..models import CUT_OVER_PHASES, SWITCHES, CutoverPhase, WorkspaceCutoverLedger

#: The forward order; each step goes to the next phase only (keyed by the ledger's phase text).
FORWARD: dict[str, CutoverPhase] = {
    CutoverPhase.INVENTORY: CutoverPhase.BACKFILL,
    CutoverPhase.BACKFILL: CutoverPhase.SHADOW,
    CutoverPhase.SHADOW: CutoverPhase.FROZEN,
    CutoverPhase.FROZEN: CutoverPhase.CUTOVER,
    CutoverPhase.CUTOVER: CutoverPhase.OBSERVING,
    CutoverPhase.OBSERVING: CutoverPhase.READY_FOR_CLEANUP,
}

FREEZE_ACK_KEYS = frozenset({"tenant_id", "ledger_cas_version", "freeze_id", "freeze_revision"})
ACTIVATION_ACK_KEYS = frozenset(
    {"tenant_id", "ledger_cas_version", "activation_id", "activation_revision"}
)
#: Smoke results: at most this many checks, each name at most 128 characters.
MAX_SMOKE_CHECKS = 100
# Largest value of the ledger's BigInteger columns (versions, revisions): 2**63 - 1, the signed
# 64-bit range every supported engine stores; a larger integer from input is 400, never 500.
BIGINT_MAX = 2**63 - 1

GATE_CLOSED_CODE = "workspace_cutover_closed"


class GateState(NamedTuple):
    """The runtime gate's answer: ``open``, a stable ``code`` and a human ``reason``.

    Codes: ``open``; ``no_ledger`` (a native tenant: product routes do not consult the gate);
    ``not_cut_over`` (phase before ``cutover``); ``rolled_back``; ``switch_off`` (one of the four
    switches is false).
    """

    open: bool
    code: str
    reason: str


class StaleVersion(Conflict):
    """409 ``stale_version``: the ledger is not at the expected phase and version any more."""

    code = "stale_version"


def _now(now: dt.datetime | None) -> dt.datetime:
    return now or timezone.now()


def _iso(value: dt.datetime | None) -> str:
    return value.isoformat() if value is not None else "unset"


# --- reading ----------------------------------------------------------------------------------


def get_ledger(tenant_id: str) -> WorkspaceCutoverLedger:
    """The tenant's ledger, or 404 ``ledger_not_found``; 400 ``invalid_tenant`` for a bad id."""
    ledger = WorkspaceCutoverLedger.objects.filter(tenant_id=validate_tenant_id(tenant_id)).first()
    if ledger is None:
        raise NotFound(f"workspace {tenant_id} has no cutover ledger", code="ledger_not_found")
    return ledger


def create_ledger(tenant_id: str) -> tuple[WorkspaceCutoverLedger, bool]:
    """Create the tenant's ledger in phase ``inventory`` (version 0), or return the existing one:
    ``(ledger, created)``. From then on the tenant's product routes follow the runtime gate."""
    tenant_id = validate_tenant_id(tenant_id)
    existing = WorkspaceCutoverLedger.objects.filter(tenant_id=tenant_id).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            return WorkspaceCutoverLedger.objects.create(tenant_id=tenant_id), True
    except IntegrityError:  # a concurrent create won
        return WorkspaceCutoverLedger.objects.get(tenant_id=tenant_id), False


def gate_state(ledger: WorkspaceCutoverLedger | None) -> GateState:
    """The runtime gate for a ledger row (``None``: no ledger). Open only if the phase is
    ``cutover``, ``observing`` or ``ready_for_cleanup``, ``cutover_at`` is set,
    ``rolled_back_at`` is NULL and all four switches are true (spec §2.6)."""
    if ledger is None:
        return GateState(False, "no_ledger", "the workspace has no cutover ledger")
    if ledger.rolled_back_at is not None:
        return GateState(
            False,
            "rolled_back",
            f"the workspace was rolled back at {ledger.rolled_back_at.isoformat()} "
            f"(phase {ledger.phase})",
        )
    if ledger.phase not in CUT_OVER_PHASES or ledger.cutover_at is None:
        return GateState(
            False, "not_cut_over", f"the workspace is in phase {ledger.phase}, not cut over yet"
        )
    off = [name for name in SWITCHES if not getattr(ledger, name)]
    if off:
        return GateState(False, "switch_off", f"switched off: {', '.join(off)}")
    return GateState(True, "open", f"cut over (phase {ledger.phase})")


_GATE_FIELDS = ("phase", "cutover_at", "rolled_back_at", *SWITCHES)


def workspace_gate(tenant_id: str) -> GateState:
    """The runtime gate of a tenant: one indexed lookup (unique ``tenant_id``), not cached, so a
    rollback closes every process's routes from its commit on."""
    ledger = WorkspaceCutoverLedger.objects.filter(tenant_id=tenant_id).only(*_GATE_FIELDS).first()
    return gate_state(ledger)


def product_route_refusal(tenant_id: str) -> GateState | None:
    """``None`` when a tenant's product routes may serve (a native tenant without a ledger, or an
    open gate); otherwise the closed gate state (the caller answers 409
    ``workspace_cutover_closed``)."""
    state = workspace_gate(tenant_id)
    return None if state.open or state.code == "no_ledger" else state


def cutover_gate(tenant_id: str) -> Refusal | None:
    """The workspace cutover as a tenant gate (:mod:`knowledgefs.auth.gates`): a refusal with
    409 ``workspace_cutover_closed`` while the tenant's runtime gate is closed; ``None`` for a
    native tenant (no ledger) or an open gate. One indexed lookup."""
    from knowledgefs.auth.gates import Refusal

    closed = product_route_refusal(tenant_id)
    if closed is None:
        return None
    return Refusal(
        GATE_CLOSED_CODE,
        f"product routes of this workspace are closed by its cutover: {closed.reason}",
        {"gate": closed.code},
    )


def ledger_as_dict(ledger: WorkspaceCutoverLedger) -> dict[str, Any]:
    """The ledger as the internal API and ``kfs cutover show`` print it, with its gate."""
    body: dict[str, Any] = {
        field.name: getattr(ledger, field.attname) for field in ledger._meta.concrete_fields
    }
    body.pop("id")
    for key, value in body.items():
        if isinstance(value, dt.datetime):
            body[key] = value.isoformat()
    gate = gate_state(ledger)
    body["gate"] = {"open": gate.open, "code": gate.code, "reason": gate.reason}
    return body


# --- compare-and-set --------------------------------------------------------------------------


def _cas(
    ledger: WorkspaceCutoverLedger,
    values: dict[str, Any],
    *,
    guard: Q | None = None,
    now: dt.datetime,
) -> WorkspaceCutoverLedger:
    """One UPDATE on (tenant, the row's phase, the row's version) writing ``values`` exactly
    (``None`` → NULL) plus ``cas_version + 1``; ``guard`` adds the step's gates to the WHERE
    clause. Raises :class:`StaleVersion` when no row matched; returns the fresh row."""
    where = Q(tenant_id=ledger.tenant_id, phase=ledger.phase, cas_version=ledger.cas_version)
    if guard is not None:
        where &= guard
    changed = WorkspaceCutoverLedger.objects.filter(where).update(
        **values, cas_version=F("cas_version") + 1, updated_at=now
    )
    if changed != 1:
        current = WorkspaceCutoverLedger.objects.get(tenant_id=ledger.tenant_id)
        raise _stale(current)
    return WorkspaceCutoverLedger.objects.get(tenant_id=ledger.tenant_id)


def _stale(current: WorkspaceCutoverLedger) -> StaleVersion:
    return StaleVersion(
        f"the ledger is now at phase {current.phase}, version {current.cas_version}; "
        "read it again and retry",
        details={"phase": current.phase, "cas_version": current.cas_version},
    )


def _check_version(expected_version: Any) -> None:
    """400 ``invalid_version`` unless ``expected_version`` is an integer in the column's range
    (0 to :data:`BIGINT_MAX`)."""
    if (
        isinstance(expected_version, bool)
        or not isinstance(expected_version, int)
        or not 0 <= expected_version <= BIGINT_MAX
    ):
        raise InvalidInput(
            f"expected_cas_version must be an integer from 0 to {BIGINT_MAX}",
            code="invalid_version",
        )


def _expect(tenant_id: str, expected_phase: str, expected_version: Any) -> WorkspaceCutoverLedger:
    """Read the ledger and check the caller's expectation (400 for malformed ones)."""
    if expected_phase not in CutoverPhase.values:
        raise InvalidInput(
            f"expected_phase must be one of {', '.join(CutoverPhase.values)}",
            code="invalid_phase",
        )
    _check_version(expected_version)
    ledger = get_ledger(tenant_id)
    if ledger.phase != expected_phase or ledger.cas_version != expected_version:
        raise _stale(ledger)
    return ledger


# --- acks -------------------------------------------------------------------------------------


def _ack_text(ack: dict[str, Any], key: str) -> str:
    value = ack[key]
    if not isinstance(value, str) or not 1 <= len(value) <= 128:
        raise InvalidInput(f"ack.{key} must be a string of 1-128 characters", code="invalid_ack")
    if not (value.isascii() and value.isprintable()):
        raise InvalidInput(f"ack.{key} must be printable ASCII", code="invalid_ack")
    return value


def _ack_int(ack: dict[str, Any], key: str, low: int) -> int:
    value = ack[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= BIGINT_MAX:
        raise InvalidInput(
            f"ack.{key} must be an integer from {low} to {BIGINT_MAX}", code="invalid_ack"
        )
    return value


def _check_ack(ack: Any, keys: frozenset[str], ledger: WorkspaceCutoverLedger) -> None:
    """Shape first (400 ``invalid_ack``), then identity (409 ``ack_mismatch``)."""
    if not isinstance(ack, dict) or set(ack) != keys:
        raise InvalidInput(
            f"the ack must be an object with exactly: {', '.join(sorted(keys))}",
            code="invalid_ack",
        )
    tenant = _ack_text(ack, "tenant_id")
    version = _ack_int(ack, "ledger_cas_version", 0)
    if tenant != ledger.tenant_id:
        raise Conflict("ack.tenant_id is not this ledger's tenant", code="ack_mismatch")
    if version != ledger.cas_version:
        raise Conflict(
            f"ack.ledger_cas_version {version} is not the expected version {ledger.cas_version}",
            code="ack_mismatch",
        )


# --- forward steps ----------------------------------------------------------------------------


class _Step(Protocol):
    """One forward step past ``shadow``: checks its ack or smoke results, then writes."""

    def __call__(
        self, ledger: WorkspaceCutoverLedger, *, ack: Any, smoke_results: Any, now: dt.datetime
    ) -> WorkspaceCutoverLedger: ...


def advance(
    tenant_id: str,
    *,
    expected_phase: str,
    expected_cas_version: int,
    to_phase: str,
    ack: Any = None,
    smoke_results: Any = None,
    now: dt.datetime | None = None,
) -> WorkspaceCutoverLedger:
    """Take one forward step ``expected_phase`` → ``to_phase`` (its successor only).

    ``ack`` is the freeze ack for ``frozen`` and the activation ack for ``cutover`` (module
    notes); ``smoke_results`` (``{"checks": [{"name": str, "passed": bool}, ...]}``, 1-100
    checks, all passed) for ``observing``; ``ready_for_cleanup`` needs the observation window
    and the maximum task expiry to have passed. Nothing is written on any error (codes:
    docs/api.md, "Workspace cutover").
    """
    now = _now(now)
    ledger = _expect(tenant_id, expected_phase, expected_cas_version)
    if FORWARD.get(ledger.phase) != to_phase:
        raise Conflict(
            f"phase {ledger.phase} does not advance to {to_phase!r}"
            + (f"; the next phase is {FORWARD[ledger.phase]}" if ledger.phase in FORWARD else ""),
            code="invalid_transition",
        )
    if to_phase in (CutoverPhase.BACKFILL, CutoverPhase.SHADOW):
        if ack is not None or smoke_results is not None:
            field = "ack" if ack is not None else "smoke_results"
            raise InvalidInput(
                f"the step to {to_phase} takes no {field}",
                code="invalid_smoke_results" if field == "smoke_results" else "invalid_ack",
            )
        return _cas(ledger, {"phase": to_phase}, now=now)
    steps: dict[str, _Step] = {
        CutoverPhase.FROZEN: _freeze,
        CutoverPhase.CUTOVER: _cut_over,
        CutoverPhase.OBSERVING: _observe,
        CutoverPhase.READY_FOR_CLEANUP: _ready,
    }
    return steps[to_phase](ledger, ack=ack, smoke_results=smoke_results, now=now)


def _freeze(
    ledger: WorkspaceCutoverLedger, *, ack: Any, smoke_results: Any, now: dt.datetime
) -> WorkspaceCutoverLedger:
    _check_ack(ack, FREEZE_ACK_KEYS, ledger)
    values = {
        "phase": CutoverPhase.FROZEN,
        "freeze_at": now,
        "remote_freeze_id": _ack_text(ack, "freeze_id"),
        "remote_freeze_revision": _ack_int(ack, "freeze_revision", 1),
        "remote_freeze_acked_at": now,
    }
    return _cas(ledger, values, now=now)


def _cut_over(
    ledger: WorkspaceCutoverLedger, *, ack: Any, smoke_results: Any, now: dt.datetime
) -> WorkspaceCutoverLedger:
    """Frozen → cutover (first or again after a rollback): the four switches, the activation
    evidence and the time fences in one UPDATE; ``rolled_back_at``, the observation window and
    the smoke results are cleared (written as NULL) in that same UPDATE."""
    _check_ack(ack, ACTIVATION_ACK_KEYS, ledger)
    activation_id = _ack_text(ack, "activation_id")
    revision = _ack_int(ack, "activation_revision", 1)
    if ledger.activation_revision is not None and revision <= ledger.activation_revision:
        raise Conflict(
            f"ack.activation_revision {revision} must exceed the recorded revision "
            f"{ledger.activation_revision}",
            code="ack_mismatch",
        )
    if ledger.freeze_at is None or ledger.remote_freeze_id is None:
        raise Conflict("the workspace has no remote freeze evidence", code="gate_closed")
    values = {
        "phase": CutoverPhase.CUTOVER,
        "cutover_at": now,
        "rolled_back_at": None,
        "rollback_cutoff_at": now
        + dt.timedelta(seconds=settings.KNOWLEDGE_CUTOVER_ROLLBACK_WINDOW_SECONDS),
        "maximum_task_expires_at": now
        + dt.timedelta(seconds=settings.KNOWLEDGE_CUTOVER_MAX_TASK_TTL_SECONDS),
        "observation_started_at": None,
        "observation_ends_at": None,
        "smoke_results": None,
        "smoke_passed_at": None,
        "activation_id": activation_id,
        "activation_revision": revision,
        "activation_ledger_cas_version": ledger.cas_version,
        "activation_acked_at": now,
        **{name: True for name in SWITCHES},
    }
    return _cas(ledger, values, guard=Q(remote_freeze_id__isnull=False), now=now)


def _open_gate_guard() -> Q:
    return Q(rolled_back_at__isnull=True, cutover_at__isnull=False, **dict.fromkeys(SWITCHES, True))


def _require_open(ledger: WorkspaceCutoverLedger) -> None:
    state = gate_state(ledger)
    if not state.open:
        raise Conflict(f"the runtime gate is closed: {state.reason}", code="gate_closed")


def _validate_smoke(results: Any) -> list[dict[str, Any]]:
    checks = results.get("checks") if isinstance(results, dict) else None
    if (
        not isinstance(results, dict)
        or set(results) != {"checks"}
        or not isinstance(checks, list)
        or not 1 <= len(checks) <= MAX_SMOKE_CHECKS
        or not all(
            isinstance(c, dict)
            and set(c) == {"name", "passed"}
            and isinstance(c["name"], str)
            and 1 <= len(c["name"]) <= 128
            and isinstance(c["passed"], bool)
            for c in checks
        )
    ):
        raise InvalidInput(
            'smoke_results must be {"checks": [{"name": str (1-128), "passed": bool}, ...]} '
            f"with 1-{MAX_SMOKE_CHECKS} checks",
            code="invalid_smoke_results",
        )
    failed = [c["name"] for c in checks if not c["passed"]]
    if failed:
        raise Conflict(f"smoke checks failed: {', '.join(failed)}", code="smoke_checks_failed")
    return checks


def _observe(
    ledger: WorkspaceCutoverLedger, *, ack: Any, smoke_results: Any, now: dt.datetime
) -> WorkspaceCutoverLedger:
    checks = _validate_smoke(smoke_results)
    _require_open(ledger)
    window = dt.timedelta(seconds=settings.KNOWLEDGE_CUTOVER_OBSERVATION_SECONDS)
    values = {
        "phase": CutoverPhase.OBSERVING,
        "smoke_results": {"checks": checks},
        "smoke_passed_at": now,
        "observation_started_at": now,
        "observation_ends_at": now + window,
    }
    return _cas(ledger, values, guard=_open_gate_guard(), now=now)


def _ready(
    ledger: WorkspaceCutoverLedger, *, ack: Any, smoke_results: Any, now: dt.datetime
) -> WorkspaceCutoverLedger:
    _require_open(ledger)
    if ledger.observation_ends_at is None or ledger.observation_ends_at > now:
        raise Conflict(
            f"the observation window ends at {_iso(ledger.observation_ends_at)}",
            code="observation_not_elapsed",
        )
    if ledger.maximum_task_expires_at is None or ledger.maximum_task_expires_at > now:
        raise Conflict(
            f"tasks issued before the cutover may run until {_iso(ledger.maximum_task_expires_at)}",
            code="task_ttl_not_elapsed",
        )
    guard = _open_gate_guard() & Q(observation_ends_at__lte=now, maximum_task_expires_at__lte=now)
    return _cas(ledger, {"phase": CutoverPhase.READY_FOR_CLEANUP}, guard=guard, now=now)


def mark_irreversible_cleanup(
    ledger: WorkspaceCutoverLedger, *, now: dt.datetime
) -> WorkspaceCutoverLedger:
    """Record that a cleanup started (``irreversible_cleanup_at``, kept if already set) by one
    compare-and-set at the row's phase and version: from then on :func:`rollback` refuses.
    Raises :class:`StaleVersion` if the ledger moved since it was read."""
    marked = ledger.irreversible_cleanup_at or now
    return _cas(ledger, {"irreversible_cleanup_at": marked}, now=now)


# --- rollback and re-cutover ------------------------------------------------------------------


def rollback(
    tenant_id: str,
    *,
    expected_phase: str,
    expected_cas_version: int,
    now: dt.datetime | None = None,
) -> WorkspaceCutoverLedger:
    """Roll a cut-over workspace back to ``frozen`` (spec §2.6).

    From ``cutover``, ``observing`` or ``ready_for_cleanup``, at the expected version, while now
    is before ``rollback_cutoff_at`` and no irreversible cleanup has started. One UPDATE: phase
    ``frozen``, ``rolled_back_at`` = now, ``product_routes_enabled`` false; the other switches,
    the activation and freeze evidence are kept. Refusals are 409 (codes: docs/api.md).
    """
    now = _now(now)
    ledger = _expect(tenant_id, expected_phase, expected_cas_version)
    if ledger.phase not in CUT_OVER_PHASES:
        raise Conflict(
            f"phase {ledger.phase} cannot be rolled back (only cutover, observing, "
            "ready_for_cleanup)",
            code="rollback_not_allowed",
        )
    if ledger.irreversible_cleanup_at is not None:
        raise Conflict(
            f"an irreversible cleanup started at {ledger.irreversible_cleanup_at.isoformat()}",
            code="irreversible_cleanup_started",
        )
    if ledger.rollback_cutoff_at is None or ledger.rollback_cutoff_at <= now:
        cutoff = ledger.rollback_cutoff_at.isoformat() if ledger.rollback_cutoff_at else "unset"
        raise Conflict(f"the rollback cutoff ({cutoff}) has passed", code="rollback_cutoff_passed")
    values = {
        "phase": CutoverPhase.FROZEN,
        "rolled_back_at": now,
        "product_routes_enabled": False,
    }
    guard = Q(irreversible_cleanup_at__isnull=True, rollback_cutoff_at__gt=now)
    return _cas(ledger, values, guard=guard, now=now)


def recutover(
    tenant_id: str,
    *,
    expected_cas_version: int,
    ack: Any,
    now: dt.datetime | None = None,
) -> WorkspaceCutoverLedger:
    """Cut a rolled-back workspace over again: ``frozen`` → ``cutover`` with a fresh activation
    ack (revision above the recorded one). The same UPDATE sets ``rolled_back_at`` back to NULL
    and turns the four switches on, so the runtime gate admits traffic again. 409
    ``not_rolled_back`` if the workspace was never rolled back; otherwise as :func:`advance`."""
    now = _now(now)
    _check_version(expected_cas_version)
    if get_ledger(tenant_id).rolled_back_at is None:
        raise Conflict(
            "the workspace was not rolled back; advance it from frozen instead",
            code="not_rolled_back",
        )
    ledger = _expect(tenant_id, CutoverPhase.FROZEN, expected_cas_version)
    return _cut_over(ledger, ack=ack, smoke_results=None, now=now)
