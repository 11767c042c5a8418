"""Who may read a quality row: the same tenant, a caller that reaches the row's space, and whose
own permission scope covers the scope the row was captured under.

A row's ``permission_scope`` is the sorted list of space ids its requester could reach (a
space-bound API key's spaces, a capability token's space), ``None`` for a tenant-wide caller
(an unbound API key, a namespace token, the operator). A caller covers it when the caller is
tenant-wide, or when the row's scope is a list contained in the caller's spaces. So a
space-bound key never reads what a tenant-wide key asked, and a row without a scope (``None``)
stays unreadable to bound callers.
"""

from __future__ import annotations

import uuid

from knowledgefs.errors import NotFound


def scope_of(principal) -> list[str] | None:
    """The permission scope to store for ``principal``: sorted space ids, ``None`` = tenant."""
    if principal.space_ids is None:
        return None
    return sorted(str(s) for s in principal.space_ids)


def provenance_of(principal) -> dict:
    """The provenance fields of a new row made by ``principal``."""
    scope = scope_of(principal)
    return {
        "tenant_id": principal.tenant_id,
        "requester_kind": principal.kind,
        "requester": principal.owner[:300],
        "caller_kind": getattr(principal, "caller_kind", None) or "",
        "api_key_id": principal.api_key_id,
        "grant_id": getattr(principal, "grant_id", None) or "",
        "permission_scope": scope,
        "scope_key": ",".join(scope) if scope is not None else "",
    }


def covers(principal, row) -> bool:
    """True if ``principal`` may read ``row`` (a :class:`~retrieval.quality.models.Provenance`)."""
    if row.tenant_id != principal.tenant_id or not principal.can_reach(row.space_id):
        return False
    if principal.space_ids is None:
        return True
    if row.permission_scope is None:
        return False
    return set(row.permission_scope) <= {str(s) for s in principal.space_ids}


def readable(principal, queryset, space):
    """``queryset`` narrowed to the rows of ``space`` ``principal`` may read, as far as the
    database can tell: the tenant and space; for a caller bound to one space, rows captured
    under exactly that scope; for one bound to several, rows with a scope (each row is then
    checked with :func:`covers`)."""
    rows = queryset.filter(tenant_id=principal.tenant_id, space=space)
    if principal.space_ids is None:
        return rows
    if len(principal.space_ids) == 1:
        return rows.filter(scope_key=str(next(iter(principal.space_ids))))
    return rows.exclude(scope_key="")


def one(principal, model, space, ident, code: str, what: str):
    """The row ``ident`` of ``space`` if ``principal`` may read it, else 404 ``code``: a foreign,
    an out-of-scope and a missing row answer alike."""
    try:
        key = uuid.UUID(str(ident))
    except ValueError:
        raise NotFound(f"{what} not found", code=code) from None
    row = model.objects.filter(id=key, space=space, tenant_id=principal.tenant_id).first()
    if row is None or not covers(principal, row):
        raise NotFound(f"{what} not found", code=code)
    return row
