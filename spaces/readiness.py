"""Readiness and servability: whether a knowledge space may compile or answer now.

:func:`require_ready` refuses a space whose profile is not ``ready`` (409 :class:`SpaceNotReady`,
whose ``code`` names the state). :func:`ensure_ready_for_compile` is a compilation's check: a
``pending-validation`` profile runs the preflight first (:mod:`spaces.preflight`).
:func:`require_servable` is the one check retrieval's entry points run (a Fast/Deep/Research
query, a research task's admission and every delivery): :func:`require_ready`, then every
registered servability gate, in registration order. A gate is ``gate(space) -> None`` that
raises a coded error (409) and should cost at most one indexed lookup. The upgrades app
registers its reconciliation gate in ``AppConfig.ready()``; spaces imports no higher app.

The profile a retrieval checks is read with one plain SQL statement per call and the model
instance built from it is kept per space (:func:`serving_profile`), keyed by every column of the
row: any change of the row (readiness, retrieval or embedding fields, ``updated_at``) is seen by
the next call, in this process or another, and only an unchanged row is served from the cache.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable

from django.db import connection

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
    (used by retrieval; the profile is :func:`serving_profile`'s, to be read, not changed)."""
    profile = serving_profile(space)
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


#: Spaces whose profile instance :func:`serving_profile` keeps (least recently used dropped).
SERVING_PROFILES = 1024
_serving: OrderedDict[uuid.UUID, tuple[tuple, SpaceProfile]] = OrderedDict()
_serving_lock = threading.Lock()


def serving_profile(space: KnowledgeSpace | uuid.UUID) -> SpaceProfile:
    """The space's profile for a retrieval: one plain SQL read of the row; the instance built
    from an identical row before is returned (shared: read it, never change or save it), else
    :func:`~spaces.profiles.profile_of` builds (or creates) it and it is kept under the row."""
    space_id = getattr(space, "pk", space)
    if not isinstance(space_id, uuid.UUID):
        space_id = uuid.UUID(str(space_id))
    row = _profile_row(space_id)
    with _serving_lock:
        held = _serving.get(space_id)
        if held is not None and row is not None and held[0] == row:
            _serving.move_to_end(space_id)
            return held[1]
    profile = profile_of(space_id)
    if row is None:  # created just now: the next call reads and keeps it
        return profile
    with _serving_lock:
        _serving[space_id] = (row, profile)
        _serving.move_to_end(space_id)
        while len(_serving) > SERVING_PROFILES:
            _serving.popitem(last=False)
    return profile


_row_sql: dict[str, str] = {}  # per database vendor


def _profile_row(space_id: uuid.UUID) -> tuple | None:
    """Every column of the space's profile row as the database gives it (``None``: no row)."""
    meta = SpaceProfile._meta
    sql = _row_sql.get(connection.vendor)
    if sql is None:
        q = connection.ops.quote_name
        # (a concrete field is one with a column: the filter drops none)
        columns = ", ".join(q(f.column) for f in meta.concrete_fields if f.column is not None)
        pk_column = meta.pk.column
        assert pk_column is not None  # the primary key is a concrete field
        sql = f"SELECT {columns} FROM {q(meta.db_table)} WHERE {q(pk_column)} = %s"
        _row_sql[connection.vendor] = sql
    key = meta.pk.get_db_prep_value(space_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [key])
        return cursor.fetchone()
