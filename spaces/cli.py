"""``kfs space create|list|set-model|set-embedding-profile|set-retrieval-profile|validate`` and
``kfs apikey create|revoke|list``: spaces and API keys on the command line (each calls a
service; wired into ``knowledgefs/management/commands/kfs.py``).

Contract of a ``kfs`` command module: ``add_parser(sub, name)`` registers the command ``name``
of :data:`COMMANDS` on the ``kfs`` sub-parser set; ``handle(command, options)`` runs the
command ``options["command"]``, writing through ``command`` (the management command: ``emit``,
``stdout``, ``stderr``). :func:`space_of` is the ``--space SLUG --tenant T`` lookup the other
command modules share."""

from __future__ import annotations

import json

from retrieval import embedding_profile, index_builds, index_versions
from retrieval.models import IndexVersion
from spaces import api_keys, preflight, profiles
from spaces import services as spaces
from spaces.models import KnowledgeSpace

COMMANDS = ("space", "apikey")


def add_parser(sub, name: str) -> None:
    """Register the ``kfs`` command ``name`` (one of :data:`COMMANDS`) on ``sub``."""
    {"space": _add_space, "apikey": _add_apikey}[name](sub)


def handle(command, options: dict) -> None:
    """Run ``kfs space …`` or ``kfs apikey …``."""
    {"space": _space, "apikey": _apikey}[options["command"]](command, options)


def space_of(options: dict) -> KnowledgeSpace:
    """The space ``options["space"]`` (a slug) of tenant ``options["tenant"]``."""
    principal = spaces.Principal(tenant_id=spaces.validate_tenant_id(options["tenant"]))
    return spaces.get_space_by_slug(principal, options["space"])


def _add_space(sub) -> None:
    space = sub.add_parser("space", help="manage knowledge spaces")
    space_sub = space.add_subparsers(dest="action", required=True)
    create = space_sub.add_parser("create", help="create a knowledge space")
    create.add_argument("name")
    create.add_argument("--tenant", required=True)
    create.add_argument("--slug")
    create.add_argument("--description", default="")
    create.add_argument(
        "--exists-ok",
        action="store_true",
        help="succeed if a space with this slug already exists",
    )
    create.add_argument("--json", action="store_true")
    set_model = space_sub.add_parser(
        "set-model", help="change a space's embedding model (builds a new index beside)"
    )
    set_model.add_argument("slug")
    set_model.add_argument("model_id")
    set_model.add_argument("--tenant", required=True)
    set_model.add_argument("--wait", action="store_true", help="build and cut over in this process")
    set_model.add_argument("--json", action="store_true")
    set_embedding = space_sub.add_parser(
        "set-embedding-profile",
        help="choose a space's embedding model (before its first document)",
    )
    set_embedding.add_argument("slug")
    set_embedding.add_argument("--tenant", required=True)
    set_embedding.add_argument("--plugin-id", required=True, help="langgenius/openai, or local")
    set_embedding.add_argument("--provider", required=True, help="openai, or local")
    set_embedding.add_argument("--model", required=True)
    set_embedding.add_argument("--revision", type=int, help="compare-and-set on this revision")
    set_embedding.add_argument("--json", action="store_true")
    set_retrieval = space_sub.add_parser(
        "set-retrieval-profile",
        help="replace a space's retrieval profile (members left out take their defaults)",
    )
    set_retrieval.add_argument("slug")
    set_retrieval.add_argument("--tenant", required=True)
    set_retrieval.add_argument("--mode", dest="default_mode", default="fast")
    set_retrieval.add_argument("--top-k", type=int, default=10)
    set_retrieval.add_argument(
        "--score-threshold", type=float, help="0..1 (needs --rerank-model); off when absent"
    )
    set_retrieval.add_argument(
        "--rerank-model", nargs=3, metavar=("PLUGIN_ID", "PROVIDER", "MODEL")
    )
    set_retrieval.add_argument(
        "--reasoning-model", nargs=3, metavar=("PLUGIN_ID", "PROVIDER", "MODEL")
    )
    set_retrieval.add_argument("--revision", type=int, help="compare-and-set on this revision")
    set_retrieval.add_argument("--json", action="store_true")
    validate = space_sub.add_parser(
        "validate", help="run a space's profile validation (catalog, credentials, real calls)"
    )
    validate.add_argument("slug")
    validate.add_argument("--tenant", required=True)
    validate.add_argument("--json", action="store_true")
    listing = space_sub.add_parser("list", help="list a tenant's knowledge spaces")
    listing.add_argument("--tenant", required=True)
    listing.add_argument("--json", action="store_true")


def _add_apikey(sub) -> None:
    apikey = sub.add_parser("apikey", help="manage API keys")
    apikey_sub = apikey.add_subparsers(dest="action", required=True)
    key_create = apikey_sub.add_parser("create", help="create a key (the secret is shown once)")
    key_create.add_argument("--tenant", required=True)
    key_create.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="SLUG",
        help="bind the key to this space (repeatable); none = whole tenant",
    )
    key_create.add_argument(
        "--dataset",
        action="append",
        default=[],
        metavar="DATASET_ID",
        help="bind the key to this Dify dataset (repeatable; reaches no space here)",
    )
    key_create.add_argument("--name", default="")
    key_create.add_argument("--json", action="store_true")
    revoke = apikey_sub.add_parser("revoke", help="revoke a key by secret or prefix")
    revoke.add_argument("key", metavar="KEY_OR_PREFIX")
    revoke.add_argument("--json", action="store_true")
    key_list = apikey_sub.add_parser("list", help="list a tenant's keys (never secrets)")
    key_list.add_argument("--tenant", required=True)
    key_list.add_argument("--json", action="store_true")


def _space(command, options: dict) -> None:
    principal = spaces.Principal(tenant_id=spaces.validate_tenant_id(options["tenant"]))
    if options["action"] == "set-model":
        space = spaces.get_space_by_slug(principal, options["slug"])
        version = index_versions.change_embedding_model(space, options["model_id"])
        if options["wait"] and version.state == "building":
            index_builds.rebuild_index_version(version.id)
        summary = IndexVersion.objects.filter(space_id=space.id).summary()
        command.emit(
            options,
            summary,
            f"active: {summary['active']}\nbuilding: {summary['building']}",
        )
        return
    if options["action"] in ("set-embedding-profile", "set-retrieval-profile", "validate"):
        _profiles(command, principal, options)
        return
    if options["action"] == "create":
        existing = None
        if options["exists_ok"] and options["slug"]:
            existing = spaces.spaces_for(principal).filter(slug=options["slug"]).first()
        space = existing or spaces.create_space(
            principal,
            name=options["name"],
            slug=options["slug"],
            description=options["description"],
        )
        payload = {
            "id": str(space.id),
            "tenant_id": space.tenant_id,
            "name": space.name,
            "slug": space.slug,
        }
        verb = "using existing" if existing else "created"
        command.emit(options, payload, f"{verb} space {space.slug} ({space.id})")
    else:
        rows = [
            {"id": str(s.id), "name": s.name, "slug": s.slug, "readiness": s.profile.state}
            for s in spaces.spaces_for(principal).select_related("profile")
        ]
        command.emit(
            options,
            {"items": rows},
            "\n".join(f"{r['slug']}\t{r['id']}\t{r['readiness']}\t{r['name']}" for r in rows)
            or "no spaces",
        )


def _profiles(command, principal, options: dict) -> None:
    """``space set-embedding-profile | set-retrieval-profile | validate``: one call to
    :mod:`spaces.profiles`; prints the readiness and both profiles."""
    space = spaces.get_space_by_slug(principal, options["slug"])
    action = options["action"]
    if action == "set-embedding-profile":
        selection = {
            "plugin_id": options["plugin_id"],
            "provider": options["provider"],
            "model": options["model"],
        }
        space = embedding_profile.set_embedding_profile(
            principal, space.id, selection, expected_revision=options["revision"]
        )
    elif action == "set-retrieval-profile":

        def selection_of(values):
            return dict(zip(("plugin_id", "provider", "model"), values, strict=True))

        body = {
            "default_mode": options["default_mode"],
            "top_k": options["top_k"],
            "score_threshold": options["score_threshold"],
            "reasoning_model": (
                selection_of(options["reasoning_model"]) if options["reasoning_model"] else None
            ),
            "rerank": (
                {"enabled": True, "model": selection_of(options["rerank_model"])}
                if options["rerank_model"]
                else {"enabled": False, "model": None}
            ),
        }
        space = profiles.set_retrieval_profile(
            principal, space.id, body, expected_revision=options["revision"]
        )
    else:
        space = preflight.validate_space(principal, space.id)
    described = profiles.describe(profiles.profile_of(space))
    readiness, embedding = described["readiness"], described["embedding_profile"]
    failure = readiness["failure"]
    lines = [
        f"space {space.slug}: {readiness['state']}"
        + (f" ({failure['code']} on {failure['field']}: {failure['message']})" if failure else ""),
        f"embedding: {embedding['plugin_id']}/{embedding['provider']}/{embedding['model']} "
        f"(dimension {embedding['dimension']}, revision {embedding['revision']})",
        f"retrieval: {json.dumps(described['retrieval_profile'], sort_keys=True)}",
    ]
    command.emit(options, {"slug": space.slug, **described}, "\n".join(lines))


def _apikey(command, options: dict) -> None:
    if options["action"] == "revoke":
        key = api_keys.describe_api_key(api_keys.revoke_api_key(options["key"]))
        command.emit(options, key, f"revoked key {key['prefix']}… of tenant {key['tenant_id']}")
        return
    tenant = spaces.validate_tenant_id(options["tenant"])
    if options["action"] == "list":
        rows = [api_keys.describe_api_key(k) for k in api_keys.list_api_keys(tenant)]
        command.emit(
            options,
            {"items": rows},
            "\n".join(_key_line(r) for r in rows) or f"no keys in tenant {tenant}",
        )
        return
    principal = spaces.Principal(tenant_id=tenant)
    bound = [spaces.get_space_by_slug(principal, slug) for slug in options["space"]]
    created, secret = api_keys.create_api_key(
        tenant, spaces=bound, datasets=options["dataset"], name=options["name"]
    )
    payload = {
        "id": str(created.id),
        "prefix": created.prefix,
        "secret": secret,
        "tenant_id": tenant,
        "bindings": api_keys.describe_api_key(created)["bindings"],
        # earlier names of the same values
        "key": secret,
        "spaces": [s.slug for s in bound],
    }
    command.emit(options, payload, f"{secret}\n(shown once; prefix {created.prefix})")


def _key_line(key: dict) -> str:
    """One ``kfs apikey list`` line: prefix, state, name, bindings, created, last used."""
    bindings = ",".join(
        b["space_slug"] if b["type"] == "knowledge_fs_space" else f"dataset:{b['dataset_id']}"
        for b in key["bindings"]
    )
    return "\t".join(
        [
            key["prefix"],
            key["state"],
            key["name"] or "-",
            bindings or "(whole tenant)",
            f"created {key['created_at']}",
            f"last used {key['last_used_at'] or 'never'}",
        ]
    )
