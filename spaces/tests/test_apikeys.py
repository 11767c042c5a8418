"""Service API keys: typed bindings, scope, never widening, the authentication cache and its
instant revocation (in this process and from another one), the migration from the old
many-to-many, the command line and the admin screens."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import uuid
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from ingestion.documents import admit_document
from knowledgefs.errors import Conflict, InvalidInput, NotFound
from knowledgefs.testing.fixtures import upload
from spaces import api_keys, key_auth
from spaces.api_keys import bind_api_key, create_api_key, revoke_api_key, unbind_api_key
from spaces.key_auth import authenticate_secret
from spaces.models import ApiKey, ApiKeyBinding, BindingType, KnowledgeSpace
from spaces.services import Principal, create_space, delete_space

ROOT = Path(__file__).resolve().parents[2]
SPACES = "/v1/knowledge-spaces"


@pytest.fixture(autouse=True)
def own_epoch_file(settings, tmp_path):
    """This test's revocation epoch, so that other runs sharing KNOWLEDGE_VAR_DIR cannot
    invalidate the cache under a test that counts cache hits."""
    settings.KNOWLEDGE_AUTH_EPOCH_FILE = tmp_path / "var" / "auth" / "revocation-epoch"
    return tmp_path / "var"


def api(secret: str) -> APIClient:
    return APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}")


def listed(client: APIClient) -> list[str]:
    response = client.get(SPACES)
    assert response.status_code == 200, response.content
    return sorted(s["id"] for s in response.json()["results"])


def cache_entry(secret: str):
    return cache.get(key_auth._auth_cache_key(hashlib.sha256(secret.encode()).hexdigest()))


@pytest.fixture
def two_spaces(db, principal):
    return create_space(principal, name="Alpha"), create_space(principal, name="Beta")


# --- the bindings table ---------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("resource_type", "with_space", "dataset_id"),
    [
        (BindingType.KNOWLEDGE_FS_SPACE, True, "ds-1"),  # both targets
        (BindingType.KNOWLEDGE_FS_SPACE, False, None),  # neither
        (BindingType.KNOWLEDGE_FS_SPACE, False, "ds-1"),  # the other type's target
        (BindingType.DATASET, True, None),
        (BindingType.DATASET, True, "ds-1"),
        (BindingType.DATASET, False, None),
        (BindingType.DATASET, False, ""),  # an empty dataset id is no dataset
        ("folder", True, None),  # no other type
    ],
)
def test_the_database_refuses_a_binding_without_exactly_its_own_target(
    tenant, space, resource_type, with_space, dataset_id
):
    key, _ = create_api_key(tenant)
    with pytest.raises(IntegrityError), transaction.atomic():
        ApiKeyBinding.objects.create(
            api_key=key,
            resource_type=resource_type,
            space=space if with_space else None,
            dataset_id=dataset_id,
        )


@pytest.mark.django_db
def test_a_key_is_bound_to_a_resource_once_and_nulls_never_collide(tenant, two_spaces):
    a, b = two_spaces
    key, _ = create_api_key(tenant, spaces=[a, b], datasets=["ds-1", "ds-2"])
    # Two space rows (dataset_id NULL) and two dataset rows (space NULL) live side by side.
    assert key.bindings.count() == 4
    for row in (
        {"resource_type": BindingType.KNOWLEDGE_FS_SPACE, "space": a},
        {"resource_type": BindingType.DATASET, "dataset_id": "ds-1"},
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            ApiKeyBinding.objects.create(api_key=key, **row)
    # The service treats binding again as done, not as an error.
    assert bind_api_key(key, a).space_id == a.id
    assert key.bindings.count() == 4


# --- scope -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_scope_follows_bindings_of_this_services_kind_only(tenant, principal, two_spaces):
    a, b = two_spaces
    foreign = create_space(Principal(tenant_id="tenant-b"), name="Foreign")
    _, unrestricted = create_api_key(tenant)
    _, bound = create_api_key(tenant, spaces=[a])
    _, datasets_only = create_api_key(tenant, datasets=["0b8f3e1c-dataset"])
    _, mixed = create_api_key(tenant, spaces=[b], datasets=["0b8f3e1c-dataset"])

    assert listed(api(unrestricted)) == sorted([str(a.id), str(b.id)])
    assert listed(api(bound)) == [str(a.id)]
    assert listed(api(datasets_only)) == []  # a dataset binding opens no space
    assert listed(api(mixed)) == [str(b.id)]
    assert api(bound).get(f"{SPACES}/{b.id}").status_code == 404
    assert api(datasets_only).get(f"{SPACES}/{a.id}").status_code == 404
    for secret in (unrestricted, bound, datasets_only, mixed):
        assert api(secret).get(f"{SPACES}/{foreign.id}").status_code == 404
    # Only an unrestricted key may create spaces.
    for secret in (bound, datasets_only):
        refused = api(secret).post(SPACES, {"name": "New"}, format="json")
        assert refused.status_code == 403
        assert refused.json()["code"] == "key_scope_forbids_create"
    assert api(unrestricted).post(SPACES, {"name": "New"}, format="json").status_code == 201

    principal_of = authenticate_secret(datasets_only)
    assert principal_of.space_ids == frozenset()
    assert authenticate_secret(unrestricted).space_ids is None


@pytest.mark.django_db
def test_binding_rules(tenant, principal, two_spaces):
    a, b = two_spaces
    foreign = create_space(Principal(tenant_id="tenant-b"), name="Foreign")
    key, secret = create_api_key(tenant)
    with pytest.raises(InvalidInput) as other_tenant:
        bind_api_key(key, foreign)
    assert other_tenant.value.code == "invalid_binding"
    with pytest.raises(InvalidInput) as other_tenant_at_creation:
        create_api_key(tenant, spaces=[foreign])
    assert other_tenant_at_creation.value.code == "invalid_binding"
    for bad in ("", "has space", "x" * 65):
        with pytest.raises(InvalidInput) as malformed:
            bind_api_key(key, dataset_id=bad)
        assert malformed.value.code == "invalid_binding"
    with pytest.raises(InvalidInput):
        bind_api_key(key, a, dataset_id="ds-1")
    with pytest.raises(InvalidInput):
        bind_api_key(key)

    # A space whose deletion started cannot be bound, at creation or later.
    KnowledgeSpace.objects.filter(id=b.id).update(deleting_at=timezone.now())
    for attempt in (lambda: bind_api_key(key, b), lambda: create_api_key(tenant, spaces=[b])):
        with pytest.raises(Conflict) as deleting:
            attempt()
        assert deleting.value.code == "space_not_bindable"
    assert not key.bindings.exists()

    # Binding an unrestricted key narrows it at once (its cached scope is dropped).
    assert len(listed(api(secret))) == 2
    bind_api_key(key, a)
    assert listed(api(secret)) == [str(a.id)]

    revoke_api_key(key)
    with pytest.raises(Conflict) as revoked:
        bind_api_key(key, dataset_id="ds-1")
    assert revoked.value.code == "api_key_revoked"
    with pytest.raises(NotFound) as missing:
        revoke_api_key("0000ffff")
    assert missing.value.code == "api_key_not_found"


@pytest.mark.django_db
def test_unbinding_the_last_binding_revokes_the_key_in_the_same_transaction(tenant, two_spaces):
    a, b = two_spaces
    key, secret = create_api_key(tenant, spaces=[a], datasets=["ds-1"])
    assert listed(api(secret)) == [str(a.id)]

    first = unbind_api_key(key, a)
    assert (first.removed, first.revoked, first.remaining) == (True, False, 1)
    assert listed(api(secret)) == []  # dataset-bound only: no space, still not widened

    # The revocation is part of the unbind's transaction: roll it back and both stay.
    binding = key.bindings.get()
    with pytest.raises(RuntimeError), transaction.atomic():
        result = unbind_api_key(key, binding)
        assert result.revoked and result.remaining == 0
        assert ApiKey.objects.get(id=key.id).revoked_at is not None
        raise RuntimeError("roll back")
    assert ApiKey.objects.get(id=key.id).revoked_at is None
    assert key.bindings.count() == 1

    last = unbind_api_key(key, "ds-1")
    assert (last.removed, last.revoked, last.remaining) == (True, True, 0)
    assert not last.key.is_active
    response = api(secret).get(SPACES)
    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"
    again = unbind_api_key(key, "ds-1")
    assert (again.removed, again.revoked) == (False, False)


@pytest.mark.django_db
def test_deleting_a_space_deletes_keys_bound_only_to_it_and_narrows_the_others(
    tenant, principal, two_spaces
):
    a, b = two_spaces
    only_a, only_a_secret = create_api_key(tenant, spaces=[a])
    a_and_b, a_and_b_secret = create_api_key(tenant, spaces=[a, b])
    a_and_dataset, a_and_dataset_secret = create_api_key(tenant, spaces=[a], datasets=["ds"])
    wide, wide_secret = create_api_key(tenant)
    for secret in (only_a_secret, a_and_b_secret, a_and_dataset_secret, wide_secret):
        assert str(a.id) in listed(api(secret))  # every cache warm

    delete_space(principal, a.id)

    assert not ApiKey.objects.filter(id=only_a.id).exists()
    assert api(only_a_secret).get(SPACES).status_code == 401
    assert listed(api(a_and_b_secret)) == [str(b.id)]
    assert listed(api(a_and_dataset_secret)) == []  # its dataset binding keeps it narrow
    third = create_space(principal, name="Third")
    assert listed(api(wide_secret)) == sorted([str(b.id), str(third.id)])
    assert api(a_and_b_secret).get(f"{SPACES}/{third.id}").status_code == 404


@pytest.mark.django_db
def test_any_deletion_of_a_space_deletes_the_keys_bound_only_to_it(tenant, two_spaces):
    # The admin, a shell or a cascade delete the row without delete_space: the guard runs.
    a, b = two_spaces
    only_a, secret = create_api_key(tenant, spaces=[a])
    both, both_secret = create_api_key(tenant, spaces=[a, b])
    assert listed(api(secret)) == [str(a.id)]
    KnowledgeSpace.objects.filter(id=a.id).delete()
    assert not ApiKey.objects.filter(id=only_a.id).exists()
    assert api(secret).get(SPACES).status_code == 401
    assert listed(api(both_secret)) == [str(b.id)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_an_unbind_racing_a_space_deletion_never_leaves_a_key_without_bindings(tenant, principal):
    """Key K is bound to A and B. The deletion of A counts K's bindings (2: keep K) and holds
    its transaction open; meanwhile B is unbound. Were the unbind to count K's bindings
    without waiting for K's row lock it would still see A's binding (1: no revocation), and
    the deletion's commit would then leave K with none: unrestricted. It must wait instead,
    then see no binding left and revoke K."""
    a, b = create_space(principal, name="A"), create_space(principal, name="B")
    key, secret = create_api_key(tenant, spaces=[a, b])
    deleting, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def delete_a() -> None:
        try:
            with transaction.atomic():
                KnowledgeSpace.objects.select_for_update().filter(id=a.id).first()
                api_keys.delete_keys_scoped_only_to(a)
                KnowledgeSpace.objects.filter(id=a.id).delete()
                deleting.set()
                release.wait(20)
        finally:
            connections.close_all()

    def unbind_b() -> None:
        try:
            outcome["result"] = unbind_api_key(key, b)
        finally:
            connections.close_all()

    deleter = threading.Thread(target=delete_a)
    deleter.start()
    assert deleting.wait(20)
    unbinder = threading.Thread(target=unbind_b)
    unbinder.start()
    unbinder.join(1.5)  # with the lock it is still waiting; without it, it is done by now
    release.set()
    deleter.join(20)
    unbinder.join(20)
    assert not deleter.is_alive() and not unbinder.is_alive()

    assert outcome["result"].revoked and outcome["result"].remaining == 0
    assert not ApiKeyBinding.objects.filter(api_key=key).exists()
    assert ApiKey.objects.get(id=key.id).revoked_at is not None
    assert api(secret).get(SPACES).status_code == 401


# --- the authentication cache ----------------------------------------------------------------


@pytest.mark.django_db
def test_revocation_with_a_warm_cache_is_immediate(tenant):
    key, secret = create_api_key(tenant)
    client = api(secret)
    assert client.get(SPACES).status_code == 200
    entry = cache_entry(secret)
    assert entry is not None and entry["id"] == str(key.id) and entry["space_ids"] is None
    with CaptureQueriesContext(connection) as cached:
        assert authenticate_secret(secret) is not None
    assert not [q for q in cached.captured_queries if "spaces_apikey" in q["sql"]]

    revoke_api_key(key.prefix)

    assert cache_entry(secret) is None
    response = client.get(SPACES)
    assert response.status_code == 401
    assert response.json() == {
        "code": "authentication_failed",
        "message": "invalid or revoked API key",
    }
    assert cache_entry(secret) is None  # refusals are never cached


@pytest.mark.django_db
def test_any_revocation_or_scope_change_discards_every_cached_record(tenant, space):
    _, secret = create_api_key(tenant)
    other, _ = create_api_key(tenant)
    assert authenticate_secret(secret) is not None
    with CaptureQueriesContext(connection) as warm:
        authenticate_secret(secret)
    assert not [q for q in warm.captured_queries if "spaces_apikey" in q["sql"]]
    # Another key's change replaces the epoch: this record (read under the old one) is dropped,
    # even though its own entry is still in this process's cache.
    bind_api_key(other, space)
    assert cache_entry(secret) is not None
    with CaptureQueriesContext(connection) as cold:
        authenticate_secret(secret)
    assert [q for q in cold.captured_queries if "spaces_apikey" in q["sql"]]


@pytest.mark.django_db
def test_an_unknown_key_is_not_cached_and_a_new_key_works_at_once(tenant):
    assert api("kfs_00000000unknown").get(SPACES).status_code == 401
    assert cache_entry("kfs_00000000unknown") is None
    _, secret = create_api_key(tenant)
    assert api(secret).get(SPACES).status_code == 200


@pytest.mark.django_db
def test_without_the_cache_every_request_reads_the_key(tenant, settings):
    settings.KNOWLEDGE_AUTH_CACHE_SECONDS = 0
    key, secret = create_api_key(tenant)
    client = api(secret)
    assert client.get(SPACES).status_code == 200
    assert cache_entry(secret) is None
    # Even a revocation written by SQL alone is seen: nothing is cached.
    ApiKey.objects.filter(id=key.id).update(revoked_at=timezone.now())
    assert client.get(SPACES).status_code == 401


@pytest.mark.django_db
def test_last_used_at_is_written_at_most_once_a_minute(tenant, monkeypatch):
    key, secret = create_api_key(tenant)
    client = api(secret)

    def updates(ctx) -> int:
        return sum(q["sql"].startswith('UPDATE "spaces_apikey"') for q in ctx.captured_queries)

    with CaptureQueriesContext(connection) as first:
        for _ in range(5):
            assert client.get(SPACES).status_code == 200
    assert updates(first) == 1
    used = ApiKey.objects.get(id=key.id).last_used_at
    assert used is not None

    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=59))
    with CaptureQueriesContext(connection) as within:
        for _ in range(3):
            assert client.get(SPACES).status_code == 200
    assert updates(within) == 0

    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=61))
    with CaptureQueriesContext(connection) as later:
        for _ in range(3):
            assert client.get(SPACES).status_code == 200
    assert updates(later) == 1
    assert ApiKey.objects.get(id=key.id).last_used_at > used

    # Another process whose memo says it is due writes nothing: the row was written this minute.
    written = ApiKey.objects.get(id=key.id).last_used_at
    cache.delete(key_auth._used_cache_key(hashlib.sha256(secret.encode()).hexdigest()))
    assert client.get(SPACES).status_code == 200
    assert ApiKey.objects.get(id=key.id).last_used_at == written


def another_process(var_dir: Path, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """``manage.py ARGV`` in a new process on this test's database and epoch folder."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "knowledgefs.testing.cluster_settings",
        "KFS_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "KFS_TEST_OBJECTS": str(tmp_path / "objects"),
        "KNOWLEDGE_VAR_DIR": str(var_dir),
        "LOG_LEVEL": "WARNING",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.django_db(transaction=True)
def test_a_key_revoked_by_another_process_fails_on_the_next_request_here(
    tenant, own_epoch_file, tmp_path
):
    key, secret = create_api_key(tenant)
    client = api(secret)
    assert client.get(SPACES).status_code == 200
    assert cache_entry(secret) is not None  # this process's locmem cache is warm

    out = another_process(own_epoch_file, tmp_path, "kfs", "apikey", "revoke", key.prefix)
    assert f"revoked key {key.prefix}" in out.stdout

    # The other process could not touch this cache; the epoch it replaced makes the entry void.
    assert cache_entry(secret) is not None
    assert client.get(SPACES).status_code == 401
    assert client.post(SPACES, {"name": "x"}, format="json").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_a_key_narrowed_by_another_process_is_narrowed_here_at_once(
    tenant, principal, own_epoch_file, tmp_path
):
    a, b = create_space(principal, name="A"), create_space(principal, name="B")
    key, secret = create_api_key(tenant, spaces=[a, b])
    client = api(secret)
    assert client.get(f"{SPACES}/{b.id}").status_code == 200
    code = (
        "from spaces.models import ApiKey, KnowledgeSpace; from spaces.api_keys import "
        f"unbind_api_key; unbind_api_key(ApiKey.objects.get(id='{key.id}'), "
        f"KnowledgeSpace.objects.get(id='{b.id}'))"
    )
    another_process(own_epoch_file, tmp_path, "shell", "-c", code)
    assert client.get(f"{SPACES}/{b.id}").status_code == 404
    assert listed(client) == [str(a.id)]


def test_cache_settings_are_checked_at_start_up(tmp_path):
    def start(**overrides: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KNOWLEDGE_AUTH")}
        env.pop("REDIS_URL", None)
        env.update(DJANGO_SETTINGS_MODULE="knowledgefs.settings", **overrides)
        code = (
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.KNOWLEDGE_AUTH_CACHE_SECONDS, settings.KNOWLEDGE_AUTH_EPOCH_FILE)"
        )
        return subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    default = start(KNOWLEDGE_VAR_DIR=str(tmp_path / "ok"))
    assert default.returncode == 0, default.stderr
    assert default.stdout.split() == ["300", str(tmp_path / "ok" / "auth" / "revocation-epoch")]
    for value in ("-1", "3601"):
        refused = start(KNOWLEDGE_VAR_DIR=str(tmp_path / "ok"), KNOWLEDGE_AUTH_CACHE_SECONDS=value)
        assert refused.returncode != 0
        assert "KNOWLEDGE_AUTH_CACHE_SECONDS" in refused.stderr
    # The epoch folder cannot be made: refuse to start (a process that cannot revoke).
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "auth").write_text("not a folder")
    refused = start(KNOWLEDGE_VAR_DIR=str(blocked))
    assert refused.returncode != 0
    assert "revocation epoch" in refused.stderr
    off = start(KNOWLEDGE_VAR_DIR=str(blocked), KNOWLEDGE_AUTH_CACHE_SECONDS="0")
    assert off.returncode == 0, off.stderr


# --- BC-29 ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_bc29_a_space_bound_key_finds_other_spaces_of_its_tenant_exactly_like_missing_ones(
    tenant, principal
):
    """BC-29: a key bound to space A must not read or write space B of the same tenant by id
    while the list hides it. Every route answers for B exactly as for an id that never existed.
    """
    mine = create_space(principal, name="Mine")
    private = create_space(principal, name="Private")
    private_doc = admit_document(
        private, filename="plan.md", data=b"# Plan\n\nsecret", enqueue=False
    )
    my_doc = admit_document(mine, filename="mine.md", data=b"# Mine\n\ntext", enqueue=False)
    _, secret = create_api_key(tenant, spaces=[mine])
    client = api(secret)

    assert listed(client) == [str(mine.id)]
    assert client.get(f"{SPACES}/{mine.id}").status_code == 200
    assert client.get(f"{SPACES}/{mine.id}/documents/{my_doc.document.id}").status_code == 200

    nowhere = uuid.uuid4()
    doc, job = private_doc.document.id, private_doc.job.id
    requests = [
        ("get", "{s}", None),
        ("patch", "{s}", {"name": "taken over"}),
        ("delete", "{s}", None),
        ("get", "{s}/documents", None),
        ("get", "{s}/documents/{d}", None),
        ("delete", "{s}/documents/{d}", None),
        ("get", "{s}/documents/{d}/text", None),
        ("get", "{s}/jobs", None),
        ("post", "{s}/retrieval-tests", {"query": "secret"}),
    ]
    for method, template, body in requests:
        got = getattr(client, method)(
            f"{SPACES}/" + template.format(s=private.id, d=doc), body, format="json"
        )
        missing = getattr(client, method)(
            f"{SPACES}/" + template.format(s=nowhere, d=uuid.uuid4()), body, format="json"
        )
        assert got.status_code == missing.status_code == 404, (method, template)
        assert got.json() == missing.json(), (method, template)
    # Its own space's path with B's document id: the document is missing, not forbidden.
    got = client.get(f"{SPACES}/{mine.id}/documents/{doc}")
    assert got.json() == client.get(f"{SPACES}/{mine.id}/documents/{uuid.uuid4()}").json()
    assert got.status_code == 404
    uploaded = upload(client, private, "x.txt", b"intrusion")
    assert uploaded.status_code == 404
    assert uploaded.json() == upload(client, KnowledgeSpace(id=nowhere), "x.txt", b"x").json()
    for method, path in (("get", "/v1/jobs/{j}"), ("delete", "/v1/jobs/{j}")):
        got = getattr(client, method)(path.format(j=job))
        missing = getattr(client, method)(path.format(j=uuid.uuid4()))
        assert got.status_code == missing.status_code == 404, path
        assert got.json() == missing.json(), path
    retry = client.post(f"/v1/jobs/{job}/retry", {}, format="json")
    assert retry.status_code == 404
    assert retry.json() == client.post(f"/v1/jobs/{uuid.uuid4()}/retry", {}, format="json").json()

    # Nothing of B changed, and the decision is the key's scope, not the tenant's.
    private.refresh_from_db()
    assert private.name == "Private"
    assert private.documents.count() == 1
    _, wide = create_api_key(tenant)
    _, bound_to_private = create_api_key(tenant, spaces=[private])
    assert api(wide).get(f"{SPACES}/{private.id}").status_code == 200
    assert api(bound_to_private).get(f"{SPACES}/{private.id}/documents/{doc}").status_code == 200
    assert api(bound_to_private).get(f"{SPACES}/{mine.id}").status_code == 404


# --- the migration from the many-to-many ----------------------------------------------------

BEFORE = [("spaces", "0001_initial")]
AFTER = [("spaces", "0004_remove_scoped_and_space_memberships")]


def secret_for(name: str) -> tuple[str, str]:
    secret = f"kfs_{name:0>8}{'x' * 40}"
    return secret, hashlib.sha256(secret.encode()).hexdigest()


@pytest.mark.django_db(transaction=True)
def test_the_migration_turns_scoped_keys_into_bindings_and_never_widens_a_key():
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(BEFORE)
        old = executor.loader.project_state(BEFORE).apps
        OldKey, OldSpace = (
            old.get_model("spaces", "ApiKey"),
            old.get_model("spaces", "KnowledgeSpace"),
        )
        a = OldSpace.objects.create(tenant_id="t", name="A", slug="a")
        b = OldSpace.objects.create(tenant_id="t", name="B", slug="b")
        foreign = OldSpace.objects.create(tenant_id="other", name="F", slug="f")
        revoked_at = timezone.now() - timedelta(days=1)

        def key(name: str, *, scoped: bool, spaces=(), **fields):
            made = OldKey.objects.create(
                tenant_id="t",
                name=name,
                prefix=name,
                key_hash=secret_for(name)[1],
                scoped=scoped,
                **fields,
            )
            made.spaces.set(spaces)
            return made.id

        two = key("two", scoped=True, spaces=[a, b])
        empty = key("empty", scoped=True)
        cross = key("cross", scoped=True, spaces=[foreign])  # never reachable
        wide = key("wide", scoped=False, spaces=[a])  # rows without effect on an unscoped key
        old_revoked = key("revoked", scoped=True, spaces=[a], revoked_at=revoked_at)

        executor.loader.build_graph()
        executor.migrate(AFTER)

        def spaces_of(key_id) -> set:
            return set(
                ApiKeyBinding.objects.filter(api_key_id=key_id).values_list("space_id", flat=True)
            )

        assert spaces_of(two) == {a.id, b.id}
        assert set(
            ApiKeyBinding.objects.filter(api_key_id=two).values_list("resource_type", flat=True)
        ) == {BindingType.KNOWLEDGE_FS_SPACE}
        for gone_scope in (empty, cross):
            assert spaces_of(gone_scope) == set()
            assert ApiKey.objects.get(id=gone_scope).revoked_at is not None
        assert spaces_of(wide) == set()
        assert ApiKey.objects.get(id=wide).revoked_at is None
        assert spaces_of(old_revoked) == {a.id}
        assert ApiKey.objects.get(id=old_revoked).revoked_at == revoked_at
        # What each key reaches now, through the real authentication.
        assert authenticate_secret(secret_for("two")[0]).space_ids == {a.id, b.id}
        assert authenticate_secret(secret_for("wide")[0]).space_ids is None
        for refused in ("empty", "cross", "revoked"):
            assert authenticate_secret(secret_for(refused)[0]) is None

        # Backward: space bindings become rows again; any binding means scoped.
        ApiKeyBinding.objects.create(api_key_id=two, resource_type="dataset", dataset_id="ds")
        datasets_only = ApiKey.objects.create(
            tenant_id="t", prefix="dsonly", key_hash=secret_for("dsonly")[1]
        )
        ApiKeyBinding.objects.create(
            api_key=datasets_only, resource_type="dataset", dataset_id="ds"
        )
        executor.loader.build_graph()
        executor.migrate(BEFORE)
        old = executor.loader.project_state(BEFORE).apps
        OldKey = old.get_model("spaces", "ApiKey")
        back = {k.id: k for k in OldKey.objects.all()}
        assert back[two].scoped and {s.id for s in back[two].spaces.all()} == {a.id, b.id}
        assert back[datasets_only.id].scoped and not back[datasets_only.id].spaces.exists()
        assert not back[wide].scoped and not back[wide].spaces.exists()
        assert back[empty].revoked_at is not None
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())


# --- command line ------------------------------------------------------------------------------


def kfs(*args: str) -> str:
    out = StringIO()
    call_command("kfs", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_kfs_apikey_create_list_and_revoke(principal):
    space = create_space(Principal(tenant_id="acme"), name="Handbook", slug="handbook")
    created = json.loads(
        kfs(
            "apikey",
            "create",
            "--tenant",
            "acme",
            "--space",
            "handbook",
            "--dataset",
            "ds-9",
            "--name",
            "ci",
            "--json",
        )  # fmt: skip
    )
    assert created["secret"].startswith("kfs_" + created["prefix"])
    assert created["tenant_id"] == "acme" and uuid.UUID(created["id"])
    assert created["bindings"] == [
        {"type": "knowledge_fs_space", "space_id": str(space.id), "space_slug": "handbook",
         "dataset_id": None},
        {"type": "dataset", "space_id": None, "space_slug": None, "dataset_id": "ds-9"},
    ]  # fmt: skip
    assert listed(api(created["secret"])) == [str(space.id)]
    plain = kfs("apikey", "create", "--tenant", "acme")
    wide_secret = plain.split()[0]
    assert wide_secret.startswith("kfs_") and "shown once" in plain

    listing = kfs("apikey", "list", "--tenant", "acme", "--json")
    rows = {r["prefix"]: r for r in json.loads(listing)["items"]}
    assert rows[created["prefix"]]["state"] == "active"
    assert rows[created["prefix"]]["name"] == "ci"
    assert len(rows[created["prefix"]]["bindings"]) == 2
    assert len(rows) == 2
    assert created["secret"] not in listing and wide_secret not in listing
    assert "key_hash" not in listing

    revoked = json.loads(kfs("apikey", "revoke", created["prefix"], "--json"))
    assert revoked["state"] == "revoked" and revoked["revoked_at"]
    assert api(created["secret"]).get(SPACES).status_code == 401
    assert f"revoked key {wide_secret[4:12]}" in kfs("apikey", "revoke", wide_secret)
    text = kfs("apikey", "list", "--tenant", "acme")
    assert created["prefix"] in text and "revoked" in text and "handbook,dataset:ds-9" in text
    assert kfs("apikey", "list", "--tenant", "nobody") == "no keys in tenant nobody\n"

    with pytest.raises(CommandError, match="api_key_not_found"):
        kfs("apikey", "revoke", "ffffffff")
    create_space(Principal(tenant_id="other"), name="Theirs", slug="theirs")
    with pytest.raises(CommandError, match="space_not_found"):
        kfs("apikey", "create", "--tenant", "acme", "--space", "theirs")
    with pytest.raises(CommandError, match="invalid_binding"):
        kfs("apikey", "create", "--tenant", "acme", "--dataset", "not a dataset id")


# --- admin ---------------------------------------------------------------------------------------

KEYS = "admin:spaces_apikey_changelist"


def change_key(admin_client, key: ApiKey, *, delete: list[ApiKeyBinding] = (), add=()):
    """POST the key's change form: delete these bindings, add these (resource_type, space,
    dataset_id) rows; the way the admin page submits its inline."""
    existing = list(key.bindings.order_by("id"))
    data = {
        "name": key.name,
        "bindings-TOTAL_FORMS": str(len(existing) + len(add)),
        "bindings-INITIAL_FORMS": str(len(existing)),
        "bindings-MIN_NUM_FORMS": "0",
        "bindings-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    for i, binding in enumerate(existing):
        data[f"bindings-{i}-id"] = str(binding.id)
        data[f"bindings-{i}-api_key"] = str(key.id)
        if binding in delete:
            data[f"bindings-{i}-DELETE"] = "on"
    for j, (kind, space, dataset) in enumerate(add, start=len(existing)):
        data[f"bindings-{j}-api_key"] = str(key.id)
        data[f"bindings-{j}-resource_type"] = kind
        data[f"bindings-{j}-space"] = str(space.id) if space else ""
        data[f"bindings-{j}-dataset_id"] = dataset or ""
    return admin_client.post(
        reverse("admin:spaces_apikey_change", args=[key.pk]), data, follow=True
    )


@pytest.mark.django_db
def test_admin_lists_filters_and_revokes_keys_through_the_service(admin_client, tenant, space):
    active, secret = create_api_key(tenant, spaces=[space], name="reporting")
    old, _ = create_api_key(tenant, name="old")
    revoke_api_key(old)
    client = api(secret)
    assert client.get(SPACES).status_code == 200  # cached

    page = admin_client.get(reverse(KEYS), {"state": "active"})
    assert active.prefix in page.content.decode() and old.prefix not in page.content.decode()
    page = admin_client.get(reverse(KEYS), {"state": "revoked"})
    assert old.prefix in page.content.decode() and active.prefix not in page.content.decode()
    found = admin_client.get(reverse(KEYS), {"q": "reporting"}).content.decode()
    assert active.prefix in found and old.prefix not in found
    detail = admin_client.get(reverse("admin:spaces_apikey_change", args=[active.pk]))
    assert detail.status_code == 200
    assert secret not in detail.content.decode()
    assert active.key_hash not in detail.content.decode()

    response = admin_client.post(
        reverse(KEYS), {"action": "revoke", "_selected_action": [str(active.pk)]}, follow=True
    )
    assert "Revoked 1 API keys" in response.content.decode()
    assert client.get(SPACES).status_code == 401


@pytest.mark.django_db
def test_admin_inline_cannot_widen_a_key(admin_client, tenant, two_spaces):
    a, b = two_spaces
    key, secret = create_api_key(tenant, spaces=[a, b])
    client = api(secret)
    assert listed(client) == sorted([str(a.id), str(b.id)])

    # Removing one of two bindings narrows the key.
    response = change_key(admin_client, key, delete=[key.bindings.get(space=b)])
    assert response.status_code == 200
    assert listed(client) == [str(a.id)]
    assert ApiKey.objects.get(id=key.id).revoked_at is None

    # Replacing the only binding in one save never passes through zero bindings.
    change_key(
        admin_client,
        key,
        delete=[key.bindings.get(space=a)],
        add=[(BindingType.KNOWLEDGE_FS_SPACE, b, None)],
    )
    assert listed(client) == [str(b.id)]

    # Removing the last binding revokes the key, and the operator is told.
    response = change_key(admin_client, key, delete=list(key.bindings.all()))
    assert "lost its last binding and was revoked" in response.content.decode()
    assert ApiKey.objects.get(id=key.id).revoked_at is not None
    assert client.get(SPACES).status_code == 401


@pytest.mark.django_db
def test_admin_inline_refuses_a_binding_without_its_target(admin_client, tenant, space):
    key, secret = create_api_key(tenant, datasets=["ds-1"])
    response = change_key(admin_client, key, add=[(BindingType.KNOWLEDGE_FS_SPACE, None, "ds")])
    assert response.status_code == 200
    assert "names a space and no dataset" in response.content.decode()
    assert key.bindings.count() == 1
    change_key(admin_client, key, add=[(BindingType.KNOWLEDGE_FS_SPACE, space, None)])
    assert listed(api(secret)) == [str(space.id)]


@pytest.mark.django_db
def test_admin_creates_a_key_through_the_service_and_shows_the_secret_once(
    admin_client, tenant, space
):
    response = admin_client.post(
        reverse("admin:spaces_apikey_add"),
        {"tenant_id": tenant, "name": "from admin", "spaces": [str(space.id)], "datasets": ""},
        follow=True,
    )
    assert response.status_code == 200
    key = ApiKey.objects.get(name="from admin")
    messages = [str(m) for m in response.context["messages"]]
    secret = next(m.split(": ")[-1] for m in messages if "shown this once" in m)
    assert secret.startswith(f"kfs_{key.prefix}")
    assert listed(api(secret)) == [str(space.id)]
    # The next page does not show it again.
    assert secret not in admin_client.get(reverse(KEYS)).content.decode()

    foreign = create_space(Principal(tenant_id="tenant-b"), name="Theirs")
    refused = admin_client.post(
        reverse("admin:spaces_apikey_add"),
        {"tenant_id": tenant, "name": "bad", "spaces": [str(foreign.id)], "datasets": ""},
    )
    assert refused.status_code == 200  # the form again, with the error
    assert "not spaces of tenant" in refused.content.decode()
    assert not ApiKey.objects.filter(name="bad").exists()


@pytest.mark.django_db
def test_deleting_a_space_in_admin_goes_through_the_service(admin_client, tenant, two_spaces):
    a, b = two_spaces
    only_a, secret = create_api_key(tenant, spaces=[a])
    admit_document(a, filename="a.md", data=b"# A\n\ntext", enqueue=False)
    response = admin_client.post(
        reverse("admin:spaces_knowledgespace_delete", args=[a.pk]), {"post": "yes"}, follow=True
    )
    assert response.status_code == 200
    assert not KnowledgeSpace.objects.filter(id=a.id).exists()
    assert not ApiKey.objects.filter(id=only_a.id).exists()
    assert api(secret).get(SPACES).status_code == 401
