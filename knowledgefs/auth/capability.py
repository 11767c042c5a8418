"""Dify capability v2 tokens: the public key set and the verifier.

A capability token is an RS256 JWT that Dify signs after checking its own access rules for one
caller, one action and one resource. KnowledgeFS holds only the public keys
(``KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS``: one current key and at most two previous ones, so
Dify can rotate without a gap) and checks, in this order:

1. shape: three base64url segments, a JSON header with ``alg=RS256`` exactly (``none`` and
   HMAC algorithms are refused before any key is touched, so a public key can never be used
   as an HMAC secret), ``typ=JWT`` and a ``kid`` naming a key in the set;
2. signature, issuer ``dify-control-plane``, audience ``knowledge-fs``, ``exp``/``nbf``/``iat``
   with 5 s leeway (pyjwt);
3. times: ``iat <= nbf < exp`` and a lifetime ``exp - iat`` of at most 60 s;
4. claims: ``cap_ver == 2``, a tenant ``namespace_id``, a known ``caller_kind`` whose ``azp``
   and subject prefix match it, ``action``, ``resource {type, id, parent_id}``, ``grant_id``,
   ``jti``.

Failures raise :class:`CapabilityError` with HTTP 401 and a stable ``code``; nothing about the
token or the tenant is echoed. The rules and claim names follow the reference service's
capability v2 contract (``knowledge-fs`` gateway, "Capability v2 token").
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jwt
from django.core.exceptions import ImproperlyConfigured

from .principal import Resource

ISSUER = "dify-control-plane"
AUDIENCE = "knowledge-fs"
ALGORITHM = "RS256"
LEEWAY_SECONDS = 5
MAX_LIFETIME_SECONDS = 60
MAX_TOKEN_BYTES = 16 * 1024
MAX_PREVIOUS_KEYS = 2
MAX_TIMESTAMP = 2**40  # year ~36800: anything later is not a time
SETTING = "KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS"

# RFC 7518 §6.3.2 (RSA) and §6.2.2 / §6.4 (EC, symmetric): members only a private key has.
PRIVATE_KEY_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})

ROOT_RESOURCE_TYPES = frozenset({"namespace", "knowledge_space"})
CHILD_RESOURCE_TYPES = frozenset(
    {"document", "job", "query", "research_task", "source", "upload_session"}
)

# caller_kind -> (azp, subject prefix). MCP session tokens reach only the operations that list
# the kind: the knowledge filesystem's routes and its MCP server at /mcp (docs/filesystem.md).
CALLER_KINDS: dict[str, tuple[str, str]] = {
    "interactive": ("dify-console", "dify-account:"),
    "service": ("dify-service-api", "dify-service-api:"),
    "agent": ("dify-agent", "dify-app:"),
    "workflow": ("dify-workflow", "dify-app:"),
    "internal_worker": ("dify-worker", "dify-worker:"),
    "mcp": ("dify-mcp", "dify-mcp-session:"),
}

_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_ACTION_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")


class CapabilityError(Exception):
    """A token refused: ``status`` (401 or 403), stable ``code`` and a message without secrets."""

    def __init__(self, code: str, message: str, *, status: int = 401) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


@dataclass(frozen=True)
class CapabilityClaims:
    """The verified claims KnowledgeFS acts on (the rest of the token is not kept)."""

    namespace_id: str
    subject: str
    caller_kind: str
    action: str
    resource: Resource
    grant_id: str
    jti: str
    issued_at: int
    expires_at: int


# --- the public key set ------------------------------------------------------------------------


def parse_public_jwks(text: str) -> dict[str, jwt.PyJWK]:
    """Parse ``KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS`` into ``{kid: PyJWK}``.

    Accepts a JSON object ``{"keys": [...]}`` with 1 to 3 RSA public keys (the current one and
    at most two previous), each with a unique ``kid``; ``use`` if present must be ``sig`` and
    ``alg`` if present must be ``RS256``. Raises :class:`ImproperlyConfigured` naming the
    setting when the text is not such a set, and in particular when any key carries private
    key members (``d``, ``p``, ``q``...): a verifier must never hold signing material.
    """
    try:
        document = json.loads(text)
    except ValueError:
        raise ImproperlyConfigured(f"{SETTING} is not valid JSON") from None
    keys = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(keys, list) or not keys:
        raise ImproperlyConfigured(f'{SETTING} must be a JSON Web Key Set: {{"keys": [...]}}')
    if len(keys) > 1 + MAX_PREVIOUS_KEYS:
        raise ImproperlyConfigured(
            f"{SETTING} holds {len(keys)} keys; at most {1 + MAX_PREVIOUS_KEYS} are allowed "
            "(the current key and two previous ones)"
        )
    parsed: dict[str, jwt.PyJWK] = {}
    for position, key in enumerate(keys):
        if not isinstance(key, dict):
            raise ImproperlyConfigured(f"{SETTING}: key {position} is not a JSON object")
        private = sorted(PRIVATE_KEY_MEMBERS & key.keys())
        if private:
            raise ImproperlyConfigured(
                f"{SETTING}: key {position} contains private key parameters "
                f"({', '.join(private)}); configure the public keys only"
            )
        kid = key.get("kid")
        if not isinstance(kid, str) or not kid or len(kid) > 200:
            raise ImproperlyConfigured(f"{SETTING}: key {position} needs a 'kid'")
        if kid in parsed:
            raise ImproperlyConfigured(f"{SETTING}: kid {kid!r} appears twice")
        if key.get("kty") != "RSA":
            raise ImproperlyConfigured(f"{SETTING}: key {kid!r} must be an RSA key (kty=RSA)")
        if key.get("use", "sig") != "sig" or key.get("alg", ALGORITHM) != ALGORITHM:
            raise ImproperlyConfigured(f"{SETTING}: key {kid!r} must be use=sig, alg=RS256")
        try:
            parsed[kid] = jwt.PyJWK(key, algorithm=ALGORITHM)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError) as exc:
            raise ImproperlyConfigured(f"{SETTING}: key {kid!r} is not usable: {exc}") from None
    return parsed


@lru_cache(maxsize=4)
def _key_set(text: str) -> dict[str, jwt.PyJWK]:
    return parse_public_jwks(text)


# --- verification ------------------------------------------------------------------------------


def looks_like_jwt(value: str) -> bool:
    """True if ``value`` has the three-segment compact shape of a JWS (not an API key)."""
    return value.count(".") == 2 and not value.startswith("kfs_")


def verify_token(token: str, *, jwks_text: str, now: float | None = None) -> CapabilityClaims:
    """Verify a capability v2 token against the public key set; returns its claims.

    ``jwks_text`` is the configured JWKS JSON. ``now`` (Unix seconds) is for tests. Raises
    :class:`CapabilityError` (401; codes: docs/security.md#error-codes).
    """
    if len(token) > MAX_TOKEN_BYTES or not token.isascii():
        raise CapabilityError("invalid_token", "the bearer token is not a capability token")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.InvalidTokenError:  # DecodeError, and pyjwt's own header checks (kid, crit)
        raise CapabilityError(
            "invalid_token", "the bearer token is not a well-formed JWT"
        ) from None
    if header.get("alg") != ALGORITHM:
        raise CapabilityError(
            "unsupported_algorithm", "capability tokens must be signed with RS256"
        )
    if header.get("typ") != "JWT":
        raise CapabilityError("invalid_token_type", "capability tokens need the header typ=JWT")
    kid = header.get("kid")
    keys = _key_set(jwks_text)
    if not isinstance(kid, str) or kid not in keys:
        raise CapabilityError(
            "unknown_signing_key", "the token's kid names no configured verification key"
        )
    current = time.time() if now is None else now
    try:
        payload = jwt.decode(
            token,
            key=keys[kid],
            algorithms=[ALGORITHM],
            audience=AUDIENCE,
            issuer=ISSUER,
            leeway=LEEWAY_SECONDS,
            options={
                "require": ["exp", "iat", "nbf", "iss", "aud", "sub", "jti"],
                "verify_exp": False,  # checked below against ``current`` so tests can pin time
                "verify_nbf": False,
                "verify_iat": False,
            },
        )
    except jwt.InvalidSignatureError:
        raise CapabilityError("invalid_signature", "the token signature does not verify") from None
    except jwt.MissingRequiredClaimError as exc:
        raise CapabilityError("missing_claim", f"the token lacks the claim {exc.claim!r}") from None
    except jwt.InvalidIssuerError:
        raise CapabilityError("invalid_issuer", f"the token issuer must be {ISSUER!r}") from None
    except jwt.InvalidAudienceError:
        raise CapabilityError(
            "invalid_audience", f"the token audience must be {AUDIENCE!r}"
        ) from None
    except jwt.InvalidTokenError:
        raise CapabilityError("invalid_token", "the token could not be verified") from None
    if payload.get("aud") != AUDIENCE:  # pyjwt also accepts a list that contains it
        raise CapabilityError("invalid_audience", f"the token audience must be {AUDIENCE!r}")
    issued_at, not_before, expires_at = _times(payload)
    if expires_at <= current - LEEWAY_SECONDS:
        raise CapabilityError("token_expired", "the token has expired")
    if not_before > current + LEEWAY_SECONDS or issued_at > current + LEEWAY_SECONDS:
        raise CapabilityError("token_not_yet_valid", "the token is not valid yet")
    if not issued_at <= not_before < expires_at:
        raise CapabilityError("invalid_token_times", "the token needs iat <= nbf < exp")
    if expires_at - issued_at > MAX_LIFETIME_SECONDS:
        raise CapabilityError(
            "token_lifetime_too_long",
            f"capability tokens may live at most {MAX_LIFETIME_SECONDS} seconds",
        )
    return _claims(payload, issued_at, expires_at)


def _times(payload: dict[str, Any]) -> tuple[int, int, int]:
    values = []
    for name in ("iat", "nbf", "exp"):
        value = payload.get(name)
        # Python's json reads Infinity, NaN and 1e400; only finite times in a sane range count.
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not 0 <= value < MAX_TIMESTAMP
        ):
            raise CapabilityError(
                "invalid_token_times", f"the claim {name!r} must be a Unix time in seconds"
            )
        values.append(int(value))
    return values[0], values[1], values[2]


def _claims(payload: dict[str, Any], issued_at: int, expires_at: int) -> CapabilityClaims:
    def text(name: str, pattern: re.Pattern[str] | None = None, limit: int = 256) -> str:
        value = payload.get(name)
        if value is None:
            raise CapabilityError("missing_claim", f"the token lacks the claim {name!r}")
        if not isinstance(value, str) or not value or len(value) > limit:
            raise CapabilityError("invalid_claims", f"the claim {name!r} must be a short string")
        if pattern is not None and not pattern.fullmatch(value):
            raise CapabilityError("invalid_claims", f"the claim {name!r} is malformed")
        return value

    version = payload.get("cap_ver")
    if isinstance(version, bool) or not isinstance(version, int) or version != 2:
        raise CapabilityError("invalid_claims", "the claim 'cap_ver' must be 2")
    namespace_id = text("namespace_id", _TENANT_RE)
    subject = text("sub")
    caller_kind = text("caller_kind")
    if caller_kind not in CALLER_KINDS:
        raise CapabilityError("invalid_claims", "the claim 'caller_kind' is not a known kind")
    azp, prefix = CALLER_KINDS[caller_kind]
    if payload.get("azp") != azp or not subject.startswith(prefix):
        raise CapabilityError(
            "invalid_claims", "the claims 'azp' and 'sub' do not match the caller kind"
        )
    if caller_kind == "interactive" and payload.get("actor") != subject:
        raise CapabilityError("invalid_claims", "an interactive token's actor must equal sub")
    action = text("action", _ACTION_RE, 120)
    grant_id = text("grant_id", _ID_RE, 128)
    jti = text("jti", None, 128)
    resource = _resource(payload.get("resource"), namespace_id)
    return CapabilityClaims(
        namespace_id=namespace_id,
        subject=subject,
        caller_kind=caller_kind,
        action=action,
        resource=resource,
        grant_id=grant_id,
        jti=jti,
        issued_at=issued_at,
        expires_at=expires_at,
    )


def _resource(value: Any, namespace_id: str) -> Resource:
    if value is None:
        raise CapabilityError("missing_claim", "the token lacks the claim 'resource'")
    if not isinstance(value, dict):
        raise CapabilityError("invalid_claims", "the claim 'resource' must be an object")
    kind, ident, parent = value.get("type"), value.get("id"), value.get("parent_id")
    if not isinstance(ident, str) or not _ID_RE.fullmatch(ident):
        raise CapabilityError("invalid_claims", "the claim 'resource.id' is malformed")
    if kind in ROOT_RESOURCE_TYPES:
        if parent is not None:
            raise CapabilityError("invalid_claims", f"a {kind} resource has no parent_id")
    elif kind in CHILD_RESOURCE_TYPES:
        if not isinstance(parent, str) or not _ID_RE.fullmatch(parent):
            raise CapabilityError(
                "invalid_claims", f"a {kind} resource needs its knowledge space as parent_id"
            )
    else:
        raise CapabilityError("invalid_claims", "the claim 'resource.type' is not a known type")
    if kind == "namespace" and ident != namespace_id:
        raise CapabilityError(
            "namespace_mismatch",
            "the token's namespace resource is not its own namespace",
            status=403,
        )
    return Resource(type=kind, id=_canonical(ident) or ident, parent_id=_canonical(parent))


def _canonical(ident: str | None) -> str | None:
    """UUIDs in one spelling (lower case, hyphens), so one grant matches however it is spelled."""
    if ident is None:
        return None
    try:
        return str(uuid.UUID(ident))
    except ValueError:
        return ident
