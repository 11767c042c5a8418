"""Test issuer of Dify capability v2 tokens: real RSA keys, real RS256 signatures.

Plays Dify's part (the signer); KnowledgeFS only ever sees the public JWKS this builds.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from functools import lru_cache
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa


@lru_cache(maxsize=8)
def private_key(name: str = "current") -> rsa.RSAPrivateKey:
    """One RSA-2048 key per name for the whole test session."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_jwk(name: str = "current", kid: str | None = None, **extra: Any) -> dict[str, Any]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private_key(name).public_key()))
    return {**jwk, "kid": kid or f"kid-{name}", "use": "sig", "alg": "RS256", **extra}


def private_jwk(name: str = "current") -> dict[str, Any]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private_key(name)))
    return {**jwk, "kid": f"kid-{name}", "use": "sig", "alg": "RS256"}


def jwks_text(*names: str) -> str:
    return json.dumps({"keys": [public_jwk(n) for n in (names or ("current",))]})


CALLER = {
    "interactive": ("dify-console", "dify-account:"),
    "service": ("dify-service-api", "dify-service-api:"),
    "agent": ("dify-agent", "dify-app:"),
    "workflow": ("dify-workflow", "dify-app:"),
    "internal_worker": ("dify-worker", "dify-worker:"),
    "mcp": ("dify-mcp", "dify-mcp-session:"),
}


def claims(
    *,
    namespace: str = "tenant-a",
    action: str,
    resource: dict[str, Any],
    caller_kind: str = "service",
    now: float | None = None,
    lifetime: int = 60,
    **overrides: Any,
) -> dict[str, Any]:
    """A complete, valid claim set for ``action`` on ``resource``; ``overrides`` replace or,
    with value ``...`` (Ellipsis), remove a claim."""
    issued = int(time.time() if now is None else now)
    azp, prefix = CALLER[caller_kind]
    subject = f"{prefix}{uuid.uuid4()}"
    body = {
        "iss": "dify-control-plane",
        "aud": "knowledge-fs",
        "sub": subject,
        "actor": subject,
        "azp": azp,
        "namespace_id": namespace,
        "caller_kind": caller_kind,
        "cap_ver": 2,
        "jti": str(uuid.uuid4()),
        "iat": issued,
        "nbf": issued,
        "exp": issued + lifetime,
        "action": action,
        "grant_id": f"grant-{uuid.uuid4()}",
        "resource": resource,
        "trace_id": "trace-test",
    }
    for name, value in overrides.items():
        if value is ...:
            body.pop(name, None)
        else:
            body[name] = value
    return body


def sign(
    payload: dict[str, Any], *, key: str = "current", headers: dict[str, Any] | None = None
) -> str:
    head = {"kid": f"kid-{key}", "typ": "JWT", **(headers or {})}
    # pyjwt adds typ=JWT itself unless told typ is empty
    head = {k: v for k, v in head.items() if v is not ... or k == "typ"}
    if head.get("typ") is ...:
        head["typ"] = None
    return jwt.encode(payload, private_key(key), algorithm="RS256", headers=head)


def token(**kwargs: Any) -> str:
    """``claims(**kwargs)`` signed with the current key."""
    key = kwargs.pop("key", "current")
    headers = kwargs.pop("headers", None)
    return sign(claims(**kwargs), key=key, headers=headers)


def unsigned(payload: dict[str, Any], header: dict[str, Any]) -> str:
    """A compact JWS with any header and an empty signature (for ``alg=none`` attacks)."""

    def part(value: dict[str, Any]) -> str:
        raw = json.dumps(value, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return f"{part(header)}.{part(payload)}."


def space_resource(space_id: object) -> dict[str, Any]:
    return {"type": "knowledge_space", "id": str(space_id), "parent_id": None}


def namespace_resource(namespace: str = "tenant-a") -> dict[str, Any]:
    return {"type": "namespace", "id": namespace, "parent_id": None}


def child_resource(kind: str, ident: object, space_id: object) -> dict[str, Any]:
    return {"type": kind, "id": str(ident), "parent_id": str(space_id)}
