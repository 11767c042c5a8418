"""Dify capability v2 tokens: the attack suite, route operations, grants, key rotation.

Tokens are real RS256 JWTs signed with RSA keys generated for the session
(knowledgefs/testing/capability.py plays Dify); KnowledgeFS sees only the public JWKS.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from django.core.exceptions import ImproperlyConfigured
from rest_framework.test import APIClient

from ingestion.models import CompilationJob
from knowledgefs.auth.capability import parse_public_jwks
from knowledgefs.models import CapabilityGrant
from knowledgefs.testing import capability as cap
from knowledgefs.testing.fixtures import upload
from spaces.services import Principal, create_space

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
INNER_KEY = "inner-key-for-tests-0123456789"


@pytest.fixture(autouse=True)
def capability_settings(settings):
    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = True
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current", "previous")
    settings.DIFY_INNER_API_KEY = INNER_KEY
    return settings


def bearer(value: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {value}")
    return api


def inner(key: str = INNER_KEY) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_X_INNER_API_KEY=key)
    return api


def read_space_token(space, **kwargs) -> str:
    return cap.token(
        action="knowledge_spaces.read", resource=cap.space_resource(space.id), **kwargs
    )


# --- the attack suite --------------------------------------------------------------------------


def hs256_with_public_key(payload: dict) -> str:
    """The classic key-confusion forgery: HMAC-SHA256 keyed with the RSA public key PEM."""
    pem = (
        cap.private_key("current")
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )

    def part(value) -> str:
        raw = json.dumps(value, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    signing_input = f"{part({'alg': 'HS256', 'typ': 'JWT', 'kid': 'kid-current'})}.{part(payload)}"
    signature = hmac.new(pem, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"


def tamper(token: str, **changes) -> str:
    """Rewrite claims in the payload segment and keep the original signature."""
    head, body, signature = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload.update(changes)
    raw = json.dumps(payload, separators=(",", ":")).encode()
    return f"{head}.{base64.urlsafe_b64encode(raw).rstrip(b'=').decode()}.{signature}"


def attack_cases(space) -> list[tuple[str, str, int, str]]:
    """(name, token, expected status, expected code) for every forgery the issue lists."""
    resource = cap.space_resource(space.id)
    action = "knowledge_spaces.read"
    now = time.time()

    def valid(**overrides) -> dict:
        return cap.claims(**{"action": action, "resource": resource, **overrides})

    good = cap.sign(valid())
    return [
        ("alg none", cap.unsigned(valid(), {"alg": "none", "typ": "JWT", "kid": "kid-current"}),
         401, "unsupported_algorithm"),
        ("HS256 keyed with the public key", hs256_with_public_key(valid()),
         401, "unsupported_algorithm"),
        ("RS512 instead of RS256",
         __import__("jwt").encode(valid(), cap.private_key("current"), algorithm="RS512",
                                  headers={"kid": "kid-current", "typ": "JWT"}),
         401, "unsupported_algorithm"),
        ("unknown kid", cap.sign(valid(), headers={"kid": "kid-nobody"}),
         401, "unknown_signing_key"),
        ("no kid", cap.sign(valid(), headers={"kid": ...}), 401, "unknown_signing_key"),
        ("no typ", cap.sign(valid(), headers={"typ": ...}), 401, "invalid_token_type"),
        ("typ not JWT", cap.sign(valid(), headers={"typ": "at+jwt"}), 401, "invalid_token_type"),
        ("signed by a key outside the set, claiming the current kid",
         cap.sign(valid(), key="attacker", headers={"kid": "kid-current"}),
         401, "invalid_signature"),
        ("expired", cap.sign(valid(now=now - 120)), 401, "token_expired"),
        ("not yet valid", cap.sign(valid(now=now + 120)), 401, "token_not_yet_valid"),
        ("wrong audience", cap.sign(valid(aud="dify-api")), 401, "invalid_audience"),
        ("wrong issuer", cap.sign(valid(iss="someone-else")), 401, "invalid_issuer"),
        ("lifetime over 60 s", cap.sign(valid(lifetime=120)), 401, "token_lifetime_too_long"),
        ("nbf before iat", cap.sign(valid(nbf=int(now) - 10)), 401, "invalid_token_times"),
        ("tampered namespace", tamper(good, namespace_id="tenant-b"), 401, "invalid_signature"),
        ("tampered action", tamper(good, action="knowledge_spaces.delete"),
         401, "invalid_signature"),
        ("no grant_id", cap.sign(valid(grant_id=...)), 401, "missing_claim"),
        ("no jti", cap.sign(valid(jti=...)), 401, "missing_claim"),
        ("no exp", cap.sign(valid(exp=...)), 401, "missing_claim"),
        ("cap_ver 1", cap.sign(valid(cap_ver=1)), 401, "invalid_claims"),
        ("azp of another caller kind", cap.sign(valid(azp="dify-console")), 401, "invalid_claims"),
        ("interactive actor is not sub",
         cap.sign(valid(caller_kind="interactive", actor="dify-account:someone-else")),
         401, "invalid_claims"),
        ("child resource without parent",
         cap.sign(valid(resource={"type": "document", "id": str(space.id), "parent_id": None})),
         401, "invalid_claims"),
        ("unknown resource type",
         cap.sign(valid(resource={"type": "dataset", "id": str(space.id), "parent_id": None})),
         401, "invalid_claims"),
        ("namespace resource of a foreign namespace",
         cap.sign(cap.claims(action="knowledge_spaces.list",
                             resource=cap.namespace_resource("tenant-b"))),
         403, "namespace_mismatch"),
        ("not a JWT at all", "aaa.bbb.ccc", 401, "invalid_token"),
        ("mcp caller (not issued)", cap.sign(valid(caller_kind="mcp")),
         403, "caller_kind_not_permitted"),
    ]  # fmt: skip


def test_every_forged_or_misused_token_is_refused_with_a_stable_code(space, caplog):
    caplog.set_level(logging.DEBUG)
    cases = attack_cases(space)
    for name, token, status, code in cases:
        url = f"/v1/knowledge-spaces/{space.id}"
        if code == "namespace_mismatch":
            url = "/v1/knowledge-spaces"
        response = bearer(token).get(url)
        assert (response.status_code, response.json().get("code")) == (status, code), name
        body = response.content.decode()
        assert token not in body and space.tenant_id not in body, name
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for _, token, _, _ in cases:
        assert token not in logged
    assert not CapabilityGrant.objects.exists()  # nothing refused was recorded as a grant


def test_a_valid_token_reads_its_space_and_records_the_grant(space):
    payload = cap.claims(action="knowledge_spaces.read", resource=cap.space_resource(space.id))
    response = bearer(cap.sign(payload)).get(f"/v1/knowledge-spaces/{space.id}")
    assert response.status_code == 200, response.content
    assert response.json()["id"] == str(space.id)
    grant = CapabilityGrant.objects.get(grant_id=payload["grant_id"])
    assert (grant.tenant_id, grant.action, grant.resource_id) == (
        "tenant-a",
        "knowledge_spaces.read",
        str(space.id),
    )
    assert grant.caller_kind == "service" and grant.revoked_at is None


def test_a_foreign_namespace_token_naming_this_tenants_space_finds_nothing(space):
    token = read_space_token(space, namespace="tenant-b")
    response = bearer(token).get(f"/v1/knowledge-spaces/{space.id}")
    assert response.status_code == 404
    assert response.json() == {"code": "space_not_found", "message": "knowledge space not found"}


def test_capability_tokens_are_refused_while_the_verifier_is_off(space, settings):
    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = False
    response = bearer(read_space_token(space)).get(f"/v1/knowledge-spaces/{space.id}")
    assert response.status_code == 401
    assert response.json()["code"] == "capability_tokens_disabled"


# --- one action, one resource ------------------------------------------------------------------


def test_a_token_is_refused_on_another_action_or_resource(space, principal):
    other = create_space(principal, name="Other")
    token = read_space_token(space)
    api = bearer(token)
    assert api.get(f"/v1/knowledge-spaces/{space.id}").status_code == 200

    patched = api.patch(f"/v1/knowledge-spaces/{space.id}", {"name": "x"}, format="json")
    assert (patched.status_code, patched.json()["code"]) == (403, "action_not_permitted")
    deleted = api.delete(f"/v1/knowledge-spaces/{space.id}")
    assert (deleted.status_code, deleted.json()["code"]) == (403, "action_not_permitted")
    documents = api.get(f"/v1/knowledge-spaces/{space.id}/documents")
    assert (documents.status_code, documents.json()["code"]) == (403, "action_not_permitted")
    listing = api.get("/v1/knowledge-spaces")
    assert (listing.status_code, listing.json()["code"]) == (403, "action_not_permitted")

    elsewhere = api.get(f"/v1/knowledge-spaces/{other.id}")
    assert (elsewhere.status_code, elsewhere.json()["code"]) == (403, "resource_not_permitted")
    space.refresh_from_db()
    assert space.name == "Test space"


def test_uuid_spellings_of_the_same_resource_match(space):
    token = read_space_token(space)
    assert bearer(token).get(f"/v1/knowledge-spaces/{str(space.id).upper()}").status_code == 200


def test_the_caller_kinds_each_operation_allows(space):
    def delete_with(kind: str):
        token = cap.token(
            action="knowledge_spaces.delete",
            resource=cap.space_resource(space.id),
            caller_kind=kind,
        )
        return bearer(token).delete(f"/v1/knowledge-spaces/{space.id}")

    for kind in ("agent", "workflow", "internal_worker"):
        refused = delete_with(kind)
        assert (refused.status_code, refused.json()["code"]) == (403, "caller_kind_not_permitted")
    assert delete_with("interactive").status_code == 204


def test_a_namespace_token_lists_and_creates_within_its_tenant_only(space):
    create_space(Principal(tenant_id="tenant-b"), name="Secret of B")
    listing = bearer(
        cap.token(action="knowledge_spaces.list", resource=cap.namespace_resource())
    ).get("/v1/knowledge-spaces")
    assert listing.status_code == 200
    assert [s["id"] for s in listing.json()["results"]] == [str(space.id)]

    created = bearer(
        cap.token(action="knowledge_spaces.create", resource=cap.namespace_resource())
    ).post("/v1/knowledge-spaces", {"name": "Made by Dify"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["tenant_id"] == "tenant-a"


def test_the_main_path_with_tokens_upload_compile_query_and_job(space):
    from knowledgefs.testing.fixtures import compile_all

    uploaded = upload(
        bearer(cap.token(action="documents.create", resource=cap.space_resource(space.id))),
        space,
        "notes.txt",
        b"Capability tokens are verified with the public key set.\n",
    )
    assert uploaded.status_code == 202, uploaded.content
    document_id = uploaded.json()["document"]["id"]
    job_id = uploaded.json()["job"]["id"]
    compile_all()

    query = bearer(cap.token(action="queries.create", resource=cap.space_resource(space.id)))
    answer = query.post(
        f"/v1/knowledge-spaces/{space.id}/retrieval-tests",
        {"query": "how are capability tokens verified"},
        format="json",
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["items"][0]["citation"]["document_id"] == document_id

    document = bearer(
        cap.token(
            action="documents.read",
            resource=cap.child_resource("document", document_id, space.id),
        )
    ).get(f"/v1/knowledge-spaces/{space.id}/documents/{document_id}")
    assert document.status_code == 200

    job_token = cap.token(action="jobs.read", resource=cap.child_resource("job", job_id, space.id))
    job = bearer(job_token).get(f"/v1/jobs/{job_id}")
    assert job.status_code == 200 and job.json()["id"] == job_id


def test_a_job_token_whose_parent_is_another_space_finds_nothing(space, principal):
    other = create_space(principal, name="Other")
    uploaded = upload(
        bearer(cap.token(action="documents.create", resource=cap.space_resource(space.id))),
        space,
        "a.txt",
        b"some text for a job\n",
    )
    job_id = uploaded.json()["job"]["id"]
    assert CompilationJob.objects.filter(id=job_id, space=space).exists()
    token = cap.token(action="jobs.read", resource=cap.child_resource("job", job_id, other.id))
    response = bearer(token).get(f"/v1/jobs/{job_id}")
    assert (response.status_code, response.json()["code"]) == (404, "job_not_found")


def test_a_document_token_for_another_parent_is_refused(space, principal):
    other = create_space(principal, name="Other")
    uploaded = upload(
        bearer(cap.token(action="documents.create", resource=cap.space_resource(space.id))),
        space,
        "a.txt",
        b"document under a parent\n",
    )
    document_id = uploaded.json()["document"]["id"]
    token = cap.token(
        action="documents.read", resource=cap.child_resource("document", document_id, other.id)
    )
    response = bearer(token).get(f"/v1/knowledge-spaces/{space.id}/documents/{document_id}")
    assert (response.status_code, response.json()["code"]) == (403, "resource_not_permitted")


def test_bindings_read_resource_ids_from_path_body_and_query():
    from rest_framework.request import Request
    from rest_framework.test import APIRequestFactory

    from knowledgefs.auth.operations import Binding, child, space_from

    factory = APIRequestFactory()
    request = Request(factory.get("/x", {"space_id": "q-1"}))
    assert space_from("query").values(request, {}) == ("q-1", None)
    raw = factory.post("/x", {"space_id": "b-1"}, format="json")
    from rest_framework.parsers import JSONParser

    body_request = Request(raw, parsers=[JSONParser()])
    assert space_from("body").values(body_request, {}) == ("b-1", None)
    assert space_from("body").values(Request(factory.post("/x")), {}) == (None, None)
    assert child("document", "document_id").values(
        request, {"space_id": "s-1", "document_id": "d-1"}
    ) == ("d-1", "s-1")
    assert Binding("namespace", "none").values(request, {"space_id": "s"}) == (None, None)


# --- grants ------------------------------------------------------------------------------------


def test_a_revoked_grant_is_refused_on_the_next_request(space):
    payload = cap.claims(action="knowledge_spaces.read", resource=cap.space_resource(space.id))
    api = bearer(cap.sign(payload))
    assert api.get(f"/v1/knowledge-spaces/{space.id}").status_code == 200

    revoked = inner().post(f"/internal/capability-grants/{payload['grant_id']}/revoke", {})
    assert revoked.status_code == 200, revoked.content
    assert revoked.json()["newly_revoked"] is True

    refused = api.get(f"/v1/knowledge-spaces/{space.id}")
    assert (refused.status_code, refused.json()["code"]) == (403, "grant_revoked")
    # a fresh token of the same grant is refused too
    now = int(time.time())
    fresh = cap.sign({**payload, "jti": "another", "iat": now, "nbf": now, "exp": now + 60})
    response = bearer(fresh).get(f"/v1/knowledge-spaces/{space.id}")
    assert (response.status_code, response.json()["code"]) == (403, "grant_revoked")
    again = inner().post(f"/internal/capability-grants/{payload['grant_id']}/revoke", {})
    assert again.json()["newly_revoked"] is False


def test_a_grant_revoked_before_its_first_use_is_refused(space):
    payload = cap.claims(action="knowledge_spaces.read", resource=cap.space_resource(space.id))
    inner().post(f"/internal/capability-grants/{payload['grant_id']}/revoke", {"reason": "x"})
    response = bearer(cap.sign(payload)).get(f"/v1/knowledge-spaces/{space.id}")
    assert (response.status_code, response.json()["code"]) == (403, "grant_revoked")


def test_a_grant_cannot_be_reused_for_another_action_or_resource(space, principal):
    other = create_space(principal, name="Other")
    first = cap.claims(action="knowledge_spaces.read", resource=cap.space_resource(space.id))
    assert bearer(cap.sign(first)).get(f"/v1/knowledge-spaces/{space.id}").status_code == 200
    reuse = cap.claims(
        action="knowledge_spaces.read",
        resource=cap.space_resource(other.id),
        grant_id=first["grant_id"],
    )
    response = bearer(cap.sign(reuse)).get(f"/v1/knowledge-spaces/{other.id}")
    assert (response.status_code, response.json()["code"]) == (403, "grant_mismatch")


def test_last_seen_is_written_at_most_once_a_minute(space):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    payload = cap.claims(action="knowledge_spaces.read", resource=cap.space_resource(space.id))
    api = bearer(cap.sign(payload))
    api.get(f"/v1/knowledge-spaces/{space.id}")
    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            assert api.get(f"/v1/knowledge-spaces/{space.id}").status_code == 200
    writes = [q["sql"] for q in queries if "knowledgefs_capabilitygrant" in q["sql"].lower()
              and q["sql"].lstrip().upper().startswith("UPDATE")]  # fmt: skip
    assert writes == []
    CapabilityGrant.objects.filter(grant_id=payload["grant_id"]).update(
        last_seen_at=CapabilityGrant.objects.get(grant_id=payload["grant_id"]).last_seen_at
        - __import__("datetime").timedelta(minutes=2)
    )
    with CaptureQueriesContext(connection) as queries:
        api.get(f"/v1/knowledge-spaces/{space.id}")
    assert (
        sum(
            q["sql"].lstrip().upper().startswith("UPDATE") and "capabilitygrant" in q["sql"].lower()
            for q in queries
        )
        == 1
    )


# --- key rotation and the key set --------------------------------------------------------------


def test_rotation_accepts_previous_keys_until_they_leave_the_set(space, settings):
    token = read_space_token(space, key="previous")
    assert bearer(token).get(f"/v1/knowledge-spaces/{space.id}").status_code == 200
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current")
    response = bearer(read_space_token(space, key="previous")).get(
        f"/v1/knowledge-spaces/{space.id}"
    )
    assert (response.status_code, response.json()["code"]) == (401, "unknown_signing_key")


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (lambda: [cap.private_jwk("current")], "private key parameters"),
        (
            lambda: [cap.public_jwk(n) for n in ("current", "previous", "old", "older")],
            "at most 3",
        ),
        (lambda: [cap.public_jwk("current"), cap.public_jwk("current")], "appears twice"),
        (lambda: [{**cap.public_jwk("current"), "kty": "oct"}], "RSA"),
        (lambda: [{**cap.public_jwk("current"), "alg": "HS256"}], "alg=RS256"),
        (lambda: [{k: v for k, v in cap.public_jwk().items() if k != "kid"}], "needs a 'kid'"),
        (lambda: [], "JSON Web Key Set"),
    ],
)
def test_unusable_key_sets_are_refused(keys, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_public_jwks(json.dumps({"keys": keys()}))
    with pytest.raises(ImproperlyConfigured, match="not valid JSON"):
        parse_public_jwks("{not json")


def test_start_up_refuses_a_private_jwks_naming_the_variable(tmp_path):
    env = {
        **os.environ,
        "KNOWLEDGE_VAR_DIR": str(tmp_path),
        "KNOWLEDGE_FS_CAPABILITY_V2_ENABLED": "true",
        "KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS": json.dumps({"keys": [cap.private_jwk()]}),
    }
    run = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert run.returncode != 0
    assert "KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS" in run.stderr
    assert "private key parameters" in run.stderr
    enabled_without_keys = {**env, "KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS": ""}
    run = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=enabled_without_keys,
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS" in run.stderr


# --- the inner API key -------------------------------------------------------------------------


def test_internal_provisioning_with_the_inner_key_is_idempotent_by_slug():
    body = {"namespace_id": "tenant-z", "name": "Handbook", "slug": "handbook"}
    first = inner().post("/internal/knowledge-spaces/provision", body, format="json")
    assert first.status_code == 201, first.content
    again = inner().post("/internal/knowledge-spaces/provision", body, format="json")
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["tenant_id"] == "tenant-z"


def test_internal_routes_refuse_everything_but_the_inner_key(api_key, space):
    body = {"namespace_id": "tenant-a", "name": "X", "slug": "x"}
    url = "/internal/knowledge-spaces/provision"
    missing = APIClient().post(url, body, format="json")
    assert (missing.status_code, missing.json()["code"]) == (401, "not_authenticated")
    wrong = inner("inner-key-for-tests-0123456780").post(url, body, format="json")
    assert (wrong.status_code, wrong.json()["code"]) == (401, "invalid_inner_api_key")
    with_api_key = bearer(api_key).post(url, body, format="json")
    assert with_api_key.status_code == 401
    token = cap.token(
        action="internal.knowledge_spaces.provision",
        resource=cap.namespace_resource(),
        caller_kind="internal_worker",
    )
    assert bearer(token).post(url, body, format="json").status_code == 401
    revoke = bearer(api_key).post("/internal/capability-grants/g-1/revoke", {}, format="json")
    assert revoke.status_code == 401
    assert not CapabilityGrant.objects.exists()


def test_product_routes_never_accept_the_inner_key(space):
    response = inner().get(f"/v1/knowledge-spaces/{space.id}")
    assert (response.status_code, response.json()["code"]) == (401, "not_authenticated")
    assert inner().get("/v1/knowledge-spaces").status_code == 401


def test_internal_routes_are_off_without_an_inner_key(settings):
    settings.DIFY_INNER_API_KEY = ""
    response = inner("anything-at-all-000000").post(
        "/internal/knowledge-spaces/provision", {}, format="json"
    )
    assert (response.status_code, response.json()["code"]) == (401, "inner_api_disabled")


def test_internal_delete_names_the_tenant_and_finds_only_its_spaces(space):
    foreign = inner().post(
        f"/internal/knowledge-spaces/{space.id}/delete", {"namespace_id": "tenant-b"}
    )
    assert (foreign.status_code, foreign.json()["code"]) == (404, "space_not_found")
    own = inner().post(
        f"/internal/knowledge-spaces/{space.id}/delete", {"namespace_id": "tenant-a"}
    )
    assert own.status_code == 204
    assert not type(space).objects.filter(id=space.id).exists()


def test_startup_refuses_a_short_inner_key(tmp_path):
    env = {**os.environ, "KNOWLEDGE_VAR_DIR": str(tmp_path), "DIFY_INNER_API_KEY": "short"}
    run = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert run.returncode != 0 and "DIFY_INNER_API_KEY" in run.stderr


# --- admin -------------------------------------------------------------------------------------


def test_grants_are_read_only_in_admin_and_revoked_through_the_service(admin_client, space):
    from django.urls import reverse

    payload = cap.claims(action="knowledge_spaces.read", resource=cap.space_resource(space.id))
    api = bearer(cap.sign(payload))
    assert api.get(f"/v1/knowledge-spaces/{space.id}").status_code == 200
    changelist = reverse("admin:knowledgefs_capabilitygrant_changelist")
    page = admin_client.get(changelist + "?revoked_at__isempty=1")
    assert page.status_code == 200 and payload["grant_id"].encode() in page.content
    change = admin_client.get(
        reverse("admin:knowledgefs_capabilitygrant_change", args=[payload["grant_id"]])
    )
    assert change.status_code == 200 and b'name="_save"' not in change.content
    assert admin_client.get(reverse("admin:knowledgefs_capabilitygrant_add")).status_code == 403
    done = admin_client.post(
        changelist,
        {"action": "revoke_grants", "_selected_action": [payload["grant_id"]]},
        follow=True,
    )
    assert b"Revoked 1 grant(s)." in done.content
    refused = api.get(f"/v1/knowledge-spaces/{space.id}")
    assert (refused.status_code, refused.json()["code"]) == (403, "grant_revoked")
    assert CapabilityGrant.objects.get(grant_id=payload["grant_id"]).revoke_reason.startswith(
        "revoked in admin by"
    )


# --- found by breaking it ----------------------------------------------------------------------


def raw_token(header: dict, payload: dict) -> str:
    return cap.unsigned(payload, header) + "c2ln"


@pytest.mark.parametrize(
    "header",
    [
        {"alg": "RS256", "typ": "JWT", "kid": 1},
        {"alg": "RS256", "typ": "JWT", "kid": None},
        {"alg": "RS256", "typ": "JWT", "kid": ["kid-current"]},
        {"alg": "none", "kid": 5},
        {"alg": "RS256", "typ": "JWT", "kid": "kid-current", "crit": ["zzz"]},
        {"alg": "RS256", "typ": "JWT", "kid": "kid-current", "crit": "zzz"},
    ],
)
def test_malformed_headers_are_401_not_500(space, header):
    response = bearer(raw_token(header, {})).get(f"/v1/knowledge-spaces/{space.id}")
    assert response.status_code == 401, response.content
    assert response.json()["code"] in {"invalid_token", "unsupported_algorithm"}


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1e400, 2**62])
def test_non_finite_or_absurd_times_are_refused(space, value):
    payload = cap.claims(action="knowledge_spaces.read", resource=cap.space_resource(space.id))
    payload["exp"] = value
    response = bearer(cap.sign(payload)).get(f"/v1/knowledge-spaces/{space.id}")
    assert (response.status_code, response.json()["code"]) == (401, "invalid_token_times")


def test_revoked_grants_are_refused_on_namespace_wide_operations_too(space):
    listing = cap.claims(action="knowledge_spaces.list", resource=cap.namespace_resource())
    assert bearer(cap.sign(listing)).get("/v1/knowledge-spaces").status_code == 200
    assert CapabilityGrant.objects.filter(grant_id=listing["grant_id"]).exists()
    inner().post(f"/internal/capability-grants/{listing['grant_id']}/revoke", {})
    refused = bearer(cap.sign({**listing, "jti": "again"})).get("/v1/knowledge-spaces")
    assert (refused.status_code, refused.json()["code"]) == (403, "grant_revoked")

    creating = cap.claims(action="knowledge_spaces.create", resource=cap.namespace_resource())
    inner().post(f"/internal/capability-grants/{creating['grant_id']}/revoke", {})
    created = bearer(cap.sign(creating)).post(
        "/v1/knowledge-spaces", {"name": "Should not exist"}, format="json"
    )
    assert (created.status_code, created.json()["code"]) == (403, "grant_revoked")
    assert not type(space).objects.filter(name="Should not exist").exists()

    # a grant first used on a space cannot be replayed tenant-wide in another namespace
    first = cap.claims(action="knowledge_spaces.read", resource=cap.space_resource(space.id))
    assert bearer(cap.sign(first)).get(f"/v1/knowledge-spaces/{space.id}").status_code == 200
    replay = cap.claims(
        namespace="tenant-b",
        action="knowledge_spaces.list",
        resource=cap.namespace_resource("tenant-b"),
        grant_id=first["grant_id"],
    )
    response = bearer(cap.sign(replay)).get("/v1/knowledge-spaces")
    assert (response.status_code, response.json()["code"]) == (403, "grant_mismatch")


def test_ids_with_a_trailing_newline_are_refused(space):
    from knowledgefs.errors import InvalidInput
    from spaces.services import validate_tenant_id

    for bad in ("acme\n", "acme\r\n"):
        with pytest.raises(InvalidInput):
            validate_tenant_id(bad)
    for overrides in ({"grant_id": "grant-x\n"}, {"namespace_id": "tenant-a\n"}):
        payload = cap.claims(
            action="knowledge_spaces.read", resource=cap.space_resource(space.id), **overrides
        )
        response = bearer(cap.sign(payload)).get(f"/v1/knowledge-spaces/{space.id}")
        assert (response.status_code, response.json()["code"]) == (401, "invalid_claims")


def test_the_audience_must_be_exactly_ours(space):
    payload = cap.claims(
        action="knowledge_spaces.read",
        resource=cap.space_resource(space.id),
        aud=["knowledge-fs", "dify-api"],
    )
    response = bearer(cap.sign(payload)).get(f"/v1/knowledge-spaces/{space.id}")
    assert (response.status_code, response.json()["code"]) == (401, "invalid_audience")


def test_one_grant_matches_whatever_spelling_of_its_uuid(space):
    first = cap.claims(action="knowledge_spaces.read", resource=cap.space_resource(space.id))
    assert bearer(cap.sign(first)).get(f"/v1/knowledge-spaces/{space.id}").status_code == 200
    upper = {**first, "jti": "2", "resource": cap.space_resource(str(space.id).upper())}
    assert bearer(cap.sign(upper)).get(f"/v1/knowledge-spaces/{space.id}").status_code == 200


def test_methods_a_route_does_not_serve_are_405_for_anyone(space, api_key):
    for api in (APIClient(), bearer(api_key), bearer(read_space_token(space))):
        for method in ("PUT", "OPTIONS"):
            response = api.generic(method, f"/v1/knowledge-spaces/{space.id}")
            assert (response.status_code, response.json()["code"]) == (405, "method_not_allowed")
            assert "GET" in response["Allow"]
    response = inner().get("/internal/capability-grants/g-1/revoke")
    assert response.status_code == 405
