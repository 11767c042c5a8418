"""Servability: whether a knowledge space may answer retrieval now.

:func:`require_servable` is the one check retrieval's entry points run (a Fast/Deep/Research
query, a research task's admission and every delivery): the profile must be ``ready``
(:func:`spaces.profiles.require_ready`, 409 otherwise), then every registered servability gate
must pass, in registration order. A gate is ``gate(space) -> None`` that raises a coded error
(409) and should cost at most one indexed lookup. The upgrades app registers its reconciliation
gate in ``AppConfig.ready()``; spaces imports no higher app.
"""

from __future__ import annotations

from collections.abc import Callable

from .models import KnowledgeSpace, SpaceProfile
from .profiles import require_ready

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
