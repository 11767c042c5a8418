"""Tenant gates: checks that may close a tenant's product routes, registered by higher apps.

The permission class (:mod:`knowledgefs.auth.permissions`) asks every registered gate, in
registration order, before a product route serves; the first refusal answers 409 with its code.
A gate is ``gate(tenant_id: str) -> Refusal | None`` and should cost at most one indexed lookup
(it runs on every product request). The upgrades app registers the workspace cutover gate in
its ``AppConfig.ready()``; this module imports no app.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Refusal:
    """Why a tenant's product routes are closed: the 409 error's code, message and details."""

    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)


TenantGate = Callable[[str], "Refusal | None"]
_gates: dict[str, TenantGate] = {}


def register(name: str, gate: TenantGate) -> None:
    """Add (or replace, by name: ``ready()`` may run twice in tests) a tenant gate."""
    _gates[name] = gate


def refusal(tenant_id: str) -> Refusal | None:
    """The first registered gate's refusal for this tenant, or ``None`` when all are open."""
    for gate in _gates.values():
        found = gate(tenant_id)
        if found is not None:
            return found
    return None
