"""Readiness and servability: whether a knowledge space may compile or answer now.

:func:`require_ready` refuses a space whose profile is not ``ready`` (409 :class:`SpaceNotReady`,
whose ``code`` names the state). :func:`ensure_ready_for_compile` is a compilation's check: a
``pending-validation`` profile runs the preflight first (:mod:`spaces.preflight`).
:func:`require_servable` is the one check retrieval's entry points run (a Fast/Deep/Research
query, a research task's admission and every delivery): :func:`require_ready`, then every
registered servability gate, in registration order. A gate is ``gate(space) -> None`` that
raises a coded error (409) and should cost at most one indexed lookup. The upgrades app
registers its reconciliation gate in ``AppConfig.ready()``; spaces imports no higher app.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from .models import KnowledgeSpace, Readiness, SpaceProfile
from .preflight import run_preflight
from .profiles import SpaceNotReady, not_ready, profile_of

__all__ = [
    "SpaceNotReady",
    "ensure_ready_for_compile",
    "register_gate",
    "require_ready",
    "require_servable",
]

ServableGate = Callable[[KnowledgeSpace], None]
_gates: dict[str, ServableGate] = {}


def register_gate(name: str, gate: ServableGate) -> None:
    """Add (or replace, by name: ``ready()`` may run twice in tests) a servability gate."""
    _gates[name] = gate


def require_servable(space: KnowledgeSpace) -> SpaceProfile:
    """The space's ready profile, after every registered gate passed; raises their 409s."""
    profile = require_ready(space)
    for gate in _gates.values():
        gate(space)
    return profile


def require_ready(space: KnowledgeSpace) -> SpaceProfile:
    """The space's profile if it is ``ready``, else 409 :class:`SpaceNotReady` naming the state
    (used by retrieval)."""
    profile = profile_of(space)
    if profile.state != Readiness.READY:
        raise not_ready(profile, space.pk)
    return profile


def ensure_ready_for_compile(space_id: uuid.UUID) -> SpaceProfile:
    """Called at the start of a compilation, inside the job's lease: returns the ready profile.

    ``pending-validation`` runs the preflight now. Raises :class:`SpaceNotReady` whose ``code``
    is the failure's (``credential_invalid``, ``model_not_found``, …, or
    ``space_setup_required``) and whose ``retryable`` says whether the job should be retried
    (a timeout or 5xx of Dify) or fail (anything that needs someone to change something).
    """
    space = KnowledgeSpace.objects.get(id=space_id)
    profile = profile_of(space)
    if profile.state == Readiness.PENDING_VALIDATION:
        profile = run_preflight(space)
    if profile.state == Readiness.READY:
        return profile
    if profile.state == Readiness.SETUP_REQUIRED:
        raise not_ready(profile, space_id)
    failure = profile.failure or {}
    code = failure.get("code") or "profile_validation_failed"
    raise SpaceNotReady(
        f"the knowledge space's {failure.get('field') or 'embedding'} model failed validation: "
        f"{failure.get('message') or profile.state}; fix it, validate again (POST "
        f"/v1/knowledge-spaces/{space_id}/profile-validation) and retry the job",
        code=code,
        retryable=bool(failure.get("retryable")) and profile.state != Readiness.VALIDATION_FAILED,
        details={"state": profile.state, "failure": profile.failure},
    )
