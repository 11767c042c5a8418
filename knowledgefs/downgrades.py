"""Guarded downgrades: reversals of migrations that would lose or widen something are refused
**before any migration of the plan runs**, whichever app the operator names.

A *guard* names one migration whose reversal is unsafe under some live condition and a check of
that condition against the schema as it stands (historical models, so the check never depends on
the code being newer or older than the database). Three places apply the guards:

* ``manage.py migrate``: a ``pre_migrate`` receiver (:func:`refuse_guarded_plan`) sees the whole
  plan, every app's migrations included, before the executor runs the first one, and stops the
  command with :class:`DowngradeRefused` listing every refusal. On MySQL/MariaDB, whose DDL is not
  transactional, this is what keeps the earlier steps of a refused plan from running.
* inside the guarded migration itself (:class:`knowledgefs.migration_ops.GuardedReversal`), the
  same check again, for a migration run by other means (e.g. ``MigrationExecutor`` directly);
  under ``sqlmigrate --backwards`` (SQL only, no live check possible) it always refuses.
* ``manage.py kfs downgrade-check APP MIGRATION``: prints the plan and every refusal and
  changes nothing (:func:`check_downgrade`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.apps import AppConfig
from django.apps.registry import Apps
from django.core.management.base import CommandError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.exceptions import AmbiguityError
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.migration import Migration
from django.db.models import Q

# How many key prefixes a refusal lists (the count is always exact).
LISTED_PREFIXES = 20
# Exit status of ``kfs downgrade-check`` (and of a refused ``migrate``) when a refusal applies;
# 1 stays "the command failed" (unknown app or migration, no database).
REFUSED_EXIT_STATUS = 3

SPACE = "knowledge_fs_space"
DATASET = "dataset"


class DowngradeRefused(CommandError):
    """A downgrade plan contains a guarded reversal whose condition holds; the message lists every
    refusal. A ``CommandError``: ``manage.py`` prints ``CommandError: <message>`` and exits with
    :data:`REFUSED_EXIT_STATUS`."""

    def __init__(self, message: str):
        super().__init__(message, returncode=REFUSED_EXIT_STATUS)


@dataclass(frozen=True)
class Refusal:
    """One guarded reversal refused: ``migration`` is ``app.name``; ``count`` rows block it;
    ``prefixes`` names at most :data:`LISTED_PREFIXES` of them."""

    migration: str
    code: str
    message: str
    count: int
    prefixes: list[str] = field(default_factory=list)

    def text(self) -> str:
        listed = ", ".join(self.prefixes)
        more = (
            f" (and {self.count - len(self.prefixes)} more)"
            if self.count > len(self.prefixes)
            else ""
        )
        return f"{self.migration}: {self.code}: {self.message} [{self.count}: {listed}{more}]"

    def as_dict(self) -> dict[str, Any]:
        return {
            "migration": self.migration,
            "code": self.code,
            "message": self.message,
            "count": self.count,
            "prefixes": self.prefixes,
        }


#: ``blockers(apps, alias)``: identifiers of the rows that make a reversal unsafe now.
Blockers = Callable[[Apps, str], list[str]]
#: A migration plan as ``MigrationExecutor.migration_plan`` returns it: ``(migration, backwards)``.
Plan = list[tuple[Migration, bool]]


@dataclass(frozen=True)
class Guard:
    """The reversal of ``app_label.migration`` is refused while ``blockers(apps, alias)`` returns
    a non-empty list of identifiers (``apps``: the historical models of the current schema)."""

    app_label: str
    migration: str
    code: str
    message: str
    blockers: Blockers
    sql_only_message: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.app_label, self.migration)

    def evaluate(self, apps: Apps, alias: str) -> Refusal | None:
        """The refusal if the condition holds now, else None."""
        found = self.blockers(apps, alias)
        if not found:
            return None
        return Refusal(
            migration=f"{self.app_label}.{self.migration}",
            code=self.code,
            message=self.message,
            count=len(found),
            prefixes=sorted(found)[:LISTED_PREFIXES],
        )


def space_only_api_keys(apps: Apps, alias: str) -> list[str]:
    """Prefixes of live (unrevoked) API keys with at least one ``knowledge_fs_space`` binding and
    no ``dataset`` binding. Reversing ``spaces.0003`` deletes space bindings; such a key would be
    left with no binding at all, and a key with none reaches the whole tenant."""
    ApiKey = apps.get_model("spaces", "ApiKey")
    Binding = apps.get_model("spaces", "ApiKeyBinding")
    bindings = Binding.objects.using(alias)
    return list(
        ApiKey.objects.using(alias)
        .filter(revoked_at__isnull=True)
        .filter(id__in=bindings.filter(resource_type=SPACE).values("api_key_id"))
        .exclude(id__in=bindings.filter(resource_type=DATASET).values("api_key_id"))
        .values_list("prefix", flat=True)
    )


GUARDS: dict[tuple[str, str], Guard] = {}


def register(guard: Guard) -> Guard:
    """Add a guard (one per migration); returns it."""
    GUARDS[guard.key] = guard
    return guard


register(
    Guard(
        app_label="spaces",
        migration="0003_bindings_from_scoped_keys",
        code="space_only_api_keys",
        message=(
            "live API keys are bound only to knowledge spaces; reversing this migration removes "
            "space bindings and would leave them with none (a key with no binding reaches the "
            "whole tenant). Revoke them first through the admin (/admin/spaces/apikey/, action "
            "'Revoke selected keys (immediately)') or `manage.py kfs apikey revoke PREFIX`, "
            "which also clears "
            "their cached authentication; keys that also have a dataset binding keep it"
        ),
        blockers=space_only_api_keys,
        sql_only_message=(
            "refused: reversing the space-bound API keys needs a live check of the keys bound "
            "only to knowledge spaces, which SQL printed by sqlmigrate cannot make; run "
            "`manage.py kfs downgrade-check spaces 0002` and then `manage.py migrate spaces 0002` "
            "against the database instead"
        ),
    )
)


def disabled_documents(apps: Apps, alias: str) -> list[str]:
    """Ids of documents whose availability is off. Reversing ``ingestion.0007`` drops
    ``Document.enabled``; applied again, it comes back ``True``, so these documents would be
    retrievable after a downgrade and upgrade."""
    Document = apps.get_model("ingestion", "Document")
    return [
        str(pk)
        for pk in Document.objects.using(alias).filter(enabled=False).values_list("id", flat=True)
    ]


CUT_OVER = ("cutover", "observing", "ready_for_cleanup")
SWITCH_FIELDS = (
    "product_routes_enabled",
    "capability_v2_enabled",
    "integrated_mode_enabled",
    "legacy_acl_read_only",
)


def closed_or_cleaning_ledgers(apps: Apps, alias: str) -> list[str]:
    """Tenant ids of cutover ledgers whose runtime gate is closed (not cut over, rolled back or
    a switch off; the rule of ``upgrades.services.cutover.gate_state``) or whose irreversible
    cleanup started. Reversing ``upgrades.0002`` drops the ledgers, which reopens the product
    routes of the first kind and forgets that the second kind's legacy data is going."""
    Ledger = apps.get_model("upgrades", "WorkspaceCutoverLedger")
    closed = Q(rolled_back_at__isnull=False) | Q(cutover_at__isnull=True)
    closed |= ~Q(phase__in=CUT_OVER)
    for name in SWITCH_FIELDS:
        closed |= Q(**{name: False})
    closed |= Q(irreversible_cleanup_at__isnull=False)
    return list(Ledger.objects.using(alias).filter(closed).values_list("tenant_id", flat=True))


def unfinished_upgrade_jobs(apps: Apps, alias: str) -> list[str]:
    """Ids of upgrade jobs queued or running, or succeeded with their reconciliation not done.
    Reversing ``upgrades.0001`` drops the jobs; the spaces of such jobs would keep a retrieval
    gate nothing can open any more (and running work would be lost)."""
    Job = apps.get_model("upgrades", "UpgradeJob")
    unfinished = Q(status__in=["queued", "running"])
    unfinished |= Q(status="succeeded", reconcile_completed_at__isnull=True)
    return [
        str(pk) for pk in Job.objects.using(alias).filter(unfinished).values_list("id", flat=True)
    ]


def nothing_blocks_live(apps: Apps, alias: str) -> list[str]:
    """No live condition: the migration reverses itself correctly through ``migrate``; only its
    printed SQL (``sqlmigrate --backwards``) is refused."""
    return []


def _sql_only(label: str, target: str, why: str) -> str:
    return (
        f"refused: reversing {label} needs {why}, which SQL printed by sqlmigrate cannot do; run "
        f"`manage.py kfs downgrade-check {target}` and then `manage.py migrate {target}` against "
        "the database instead"
    )


register(
    Guard(
        app_label="ingestion",
        migration="0007_document_availability",
        code="disabled_documents",
        message=(
            "documents are disabled; reversing this migration drops their availability and "
            "applying it again would make them retrievable. Enable or delete those documents "
            "first (PATCH /v1/knowledge-spaces/{space}/documents/{id} with enabled true, or "
            "DELETE it)"
        ),
        blockers=disabled_documents,
        sql_only_message=_sql_only(
            "document availability", "ingestion 0006", "a live check of disabled documents"
        ),
    )
)
register(
    Guard(
        app_label="upgrades",
        migration="0002_cutover_ledger",
        code="cutover_ledgers_in_use",
        message=(
            "cutover ledgers have a closed gate or a started cleanup; reversing this migration "
            "drops them and would reopen those tenants' product routes. Finish the cutover "
            "(`manage.py kfs cutover`), or delete the ledgers of tenants that are done with it, "
            "first"
        ),
        blockers=closed_or_cleaning_ledgers,
        sql_only_message=_sql_only(
            "the cutover ledgers", "upgrades 0001", "a live check of the ledgers' gates"
        ),
    )
)
register(
    Guard(
        app_label="upgrades",
        migration="0001_upgrade_jobs",
        code="upgrade_jobs_unfinished",
        message=(
            "upgrade jobs are queued, running, or succeeded with reconciliation not done; "
            "reversing this migration drops them and their spaces would keep a retrieval gate "
            "nothing opens. Let them finish and reconcile (`manage.py kfs upgrade`), or delete "
            "them through the admin, first"
        ),
        blockers=unfinished_upgrade_jobs,
        sql_only_message=_sql_only(
            "the upgrade jobs", "upgrades zero", "a live check of unfinished upgrade jobs"
        ),
    )
)
register(
    Guard(
        app_label="upgrades",
        migration="0004_cleanup_completion",
        code="sql_only",
        message="",
        blockers=nothing_blocks_live,
        sql_only_message=_sql_only(
            "the cleanup completion",
            "upgrades 0003",
            "completed authorizations demoted to started before the three-status checks return",
        ),
    )
)


def refusals_for_plan(plan: Plan | None, apps: Apps, alias: str) -> list[Refusal]:
    """Every refusal that applies to the backwards steps of ``plan`` (``[(Migration,
    backwards)]``, as ``MigrationExecutor.migration_plan`` returns), in plan order."""
    refusals: list[Refusal] = []
    for migration, backwards in plan or ():
        guard = GUARDS.get((migration.app_label, migration.name)) if backwards else None
        if guard is not None:
            refusal = guard.evaluate(apps, alias)
            if refusal is not None:
                refusals.append(refusal)
    return refusals


def refusal_message(refusals: list[Refusal]) -> str:
    """The text of a refused plan: one line per refusal; nothing was changed."""
    lines = "\n".join(f"  {r.text()}" for r in refusals)
    return f"downgrade refused before any migration ran; nothing was changed:\n{lines}"


def refuse_guarded_plan(
    sender: Any,
    app_config: AppConfig | None = None,
    using: str = "default",
    apps: Apps | None = None,
    plan: Plan | None = None,
    **kwargs: Any,
) -> None:
    """``pre_migrate`` receiver: raise :class:`DowngradeRefused` when the plan reverses a guarded
    migration whose condition holds. Acts once per ``migrate`` (for this app's signal); ``apps``
    are the models of the applied migrations (the schema as it stands)."""
    if app_config is None or app_config.label != "knowledgefs" or not plan or apps is None:
        return
    refusals = refusals_for_plan(plan, apps, using)
    if refusals:
        raise DowngradeRefused(refusal_message(refusals))


@dataclass
class DowngradeCheck:
    """The answer of :func:`check_downgrade`: the plan as ``[(\"app.migration\", direction)]``
    and the refusals (``allowed`` when none)."""

    target: tuple[str, str]
    plan: list[tuple[str, str]]
    refusals: list[Refusal]

    @property
    def allowed(self) -> bool:
        return not self.refusals

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": {"app": self.target[0], "migration": self.target[1]},
            "plan": [{"migration": m, "direction": d} for m, d in self.plan],
            "allowed": self.allowed,
            "refusals": [r.as_dict() for r in self.refusals],
        }


def resolve_target(executor: MigrationExecutor, app_label: str, name: str) -> tuple[Any, ...]:
    """``(app_label, migration name or None)`` as ``manage.py migrate APP NAME`` resolves it:
    ``zero`` or a unique prefix. Raises ``CommandError`` naming the app or the prefix."""
    loader = executor.loader
    if app_label not in loader.migrated_apps:
        raise CommandError(f"app {app_label!r} has no migrations")
    if name == "zero":
        return (app_label, None)
    try:
        migration = loader.get_migration_by_prefix(app_label, name)
    except KeyError:
        raise CommandError(f"no migration of {app_label!r} matches {name!r}") from None
    except AmbiguityError:
        raise CommandError(f"{name!r} matches several migrations of {app_label!r}") from None
    return (app_label, migration.name)


def check_downgrade(connection: BaseDatabaseWrapper, app_label: str, name: str) -> DowngradeCheck:
    """The plan ``migrate APP NAME`` would run and every guard refusal, changing nothing.

    Reads the applied migrations and the guarded rows only. Raises ``CommandError`` for an
    unknown app or migration prefix.
    """
    executor = MigrationExecutor(connection)
    target = resolve_target(executor, app_label, name)
    plan = executor.migration_plan([target])
    # The models of the applied migrations: the same state `migrate` hands to pre_migrate.
    # A private helper of Django's executor (no stub member), as `migrate` itself calls it.
    state = executor._create_project_state(with_applied_migrations=True)  # type: ignore[attr-defined]
    apps = state.apps
    return DowngradeCheck(
        target=(app_label, target[1] or "zero"),
        plan=[
            (f"{m.app_label}.{m.name}", "backwards" if backwards else "forwards")
            for m, backwards in plan
        ],
        refusals=refusals_for_plan(plan, apps, connection.alias),
    )
