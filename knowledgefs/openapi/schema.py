"""The schema inspector of the API's OpenAPI 3 document (drf-spectacular).

What inference cannot see is declared here, in one place: the three credentials as
:mod:`knowledgefs.auth` really checks them, the error envelope ``{code, message, details?}`` of
:mod:`knowledgefs.errors` on every operation, operation ids and tags from the operation registry
(:mod:`knowledgefs.auth.operations`); the request and response shapes of views that read their
bodies by hand are the route annotations (:mod:`knowledgefs.openapi.common`, registered by
:func:`knowledgefs.openapi.register` from knowledgefs/urls.py).
``manage.py spectacular --validate --fail-on-warn`` must stay silent (tests/system/test_openapi.py).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import Direction
from rest_framework import serializers

from knowledgefs.auth.operations import Operation, operation_for

CUTOVER_CLOSED = "`workspace_cutover_closed`: the tenant's cutover gate is closed (`details.gate`)."
# Error statuses every product operation may answer, whatever the route (docs/api.md, "Errors"):
# a malformed body or parameter, no or a refused credential, a token outside its grant or a
# closed cutover gate, an unknown id, the operation's rate limit.
PRODUCT_ERRORS: dict[int, str] = {
    400: "Refused input: `invalid_request`, `malformed_request` or a field's own code; "
    "`message` names the field and the limit.",
    401: "No credential, or one refused: `not_authenticated`, `authentication_failed`, "
    "`capability_tokens_disabled`, or a capability token code (`token_expired`, "
    "`invalid_signature`, ...; docs/security.md).",
    403: "A valid credential outside its scope: `action_not_permitted`, "
    "`resource_not_permitted`, `caller_kind_not_permitted`, `grant_revoked`, `grant_mismatch`, "
    "`credential_not_permitted`.",
    404: "Unknown, or not the caller's (ids of other tenants answer the same): `not_found`, "
    "`space_not_found`, `document_not_found`, `job_not_found`, ...",
    409: CUTOVER_CLOSED,
    429: "`rate_limited`: over the operation's rate limit; `Retry-After` gives the seconds.",
}
# Internal routes take only X-Inner-Api-Key and are not rate limited.
INTERNAL_ERRORS: dict[int, str] = {
    400: "Refused input: `invalid_request` or a field's own code.",
    401: "`not_authenticated`, `invalid_inner_api_key`, `inner_api_disabled` "
    "(DIFY_INNER_API_KEY is not set).",
    403: "`credential_not_permitted`: a product credential on an internal route.",
    404: "`not_found` or the resource's own code.",
}

TAGS = {
    "knowledge-spaces": "knowledge-spaces",
    "documents": "documents",
    "jobs": "jobs",
    "retrieval-tests": "retrieval",
    "golden-questions": "retrieval",
    "queries": "queries",
    "research-tasks": "research-tasks",
}


class ErrorEnvelopeSerializer(serializers.Serializer[Any]):
    """The body of every error (:func:`knowledgefs.errors.api_exception_handler`)."""

    code = serializers.CharField(help_text="Stable machine-readable code, e.g. `not_found`.")
    message = serializers.CharField(help_text="What was refused, naming the field or limit.")
    details = serializers.JSONField(
        required=False, help_text="Structured context (limits, the field, ids), when useful."
    )


class KnowledgeAutoSchema(AutoSchema):
    """drf-spectacular's inspector with the operation registry and the error envelope.

    - ``operationId``: the registered action (``documents.create``); actions are unique per
      route and method (drf-spectacular warns on a duplicate, which fails the schema test).
    - tags: the product area (``documents``, ``queries``...) or ``internal``.
    - every operation lists the error statuses it can answer with :class:`ErrorEnvelopeSerializer`
      (:data:`PRODUCT_ERRORS` or :data:`INTERNAL_ERRORS`) on top of the ones its annotation
      declares; a status the annotation declares keeps the annotation's description (a
      product 409 also names ``workspace_cutover_closed``).
    """

    def _operation(self) -> Operation | None:
        return operation_for(self.view, self.method)

    def get_operation_id(self) -> str:
        operation = self._operation()
        return operation.action if operation is not None else super().get_operation_id()

    def get_tags(self) -> list[str]:
        if self.path.startswith("/internal/"):
            return ["internal"]
        parts = [p for p in self.path.split("/") if p and not p.startswith("{")]
        for part in reversed(parts):
            if part in TAGS:
                return [TAGS[part]]
        return super().get_tags()

    # drf-spectacular's AutoSchema narrows DRF's get_description(path, method) to
    # get_description() (with its own ignore[override]); this override keeps its signature.
    def get_description(self) -> str:  # type: ignore[override]
        text = super().get_description() or ""
        operation = self._operation()
        if operation is None:
            return text
        if operation.internal:
            who = "Credential: `X-Inner-Api-Key` only."
        else:
            callers = ", ".join(sorted(operation.callers))
            who = (
                f"Capability token action `{operation.action}` on resource "
                f"`{operation.binding.type}` (caller kinds: {callers}), or a service API key."
            )
        return f"{text}\n\n{who}".strip()

    def _get_response_bodies(self, direction: Direction = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        operation = self._operation()
        errors = INTERNAL_ERRORS if operation is not None and operation.internal else PRODUCT_ERRORS
        for status, description in errors.items():
            if str(status) in responses:
                if status == 409 and errors is PRODUCT_ERRORS:  # the gate closes every route
                    responses["409"]["description"] += f" Also {CUTOVER_CLOSED}"
                continue
            # drf-spectacular leaves _get_response_for_code unannotated.
            response = self._get_response_for_code(  # type: ignore[no-untyped-call]
                ErrorEnvelopeSerializer, str(status), ["application/json"], direction
            )
            response["description"] = description
            responses[str(status)] = response
        return dict(sorted(responses.items()))


# drf-spectacular's extension registry (__init_subclass__ of OpenApiGeneratorExtension) is
# unannotated, hence the ignore[no-untyped-call] on each extension class.
class ApiKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """``Authorization: Bearer kfs_…`` (:class:`spaces.authentication.ApiKeyAuthentication`)."""

    target_class = "spaces.authentication.ApiKeyAuthentication"
    name = "apiKey"
    priority = 1

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "kfs_<prefix><secret>",
            "description": (
                "A service API key of one tenant (`kfs apikey create`), scoped by its space "
                "bindings; spaces outside its scope answer 404."
            ),
        }


class CapabilityTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """``Authorization: Bearer <JWT>``
    (:class:`knowledgefs.auth.authentication.CapabilityTokenAuthentication`)."""

    target_class = "knowledgefs.auth.authentication.CapabilityTokenAuthentication"
    name = "capabilityToken"
    priority = 1

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": (
                "A Dify capability v2 token: RS256, issuer `dify-control-plane`, audience "
                "`knowledge-fs`, at most 60 s of lifetime, one action on one resource "
                "(the operation's description names both). Accepted when "
                "KNOWLEDGE_FS_CAPABILITY_V2_ENABLED is true."
            ),
        }


class InnerApiKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """``X-Inner-Api-Key`` (:class:`knowledgefs.auth.authentication.InnerApiKeyAuthentication`)."""

    target_class = "knowledgefs.auth.authentication.InnerApiKeyAuthentication"
    name = "innerApiKey"
    priority = 1

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "X-Inner-Api-Key",
            "description": "Dify's inner API key (DIFY_INNER_API_KEY); internal routes only.",
        }


Endpoint = tuple[str, str, str, Any]
"""drf-spectacular's endpoint: path, path regex, HTTP method, view callback."""


def only_api_routes(endpoints: list[Endpoint]) -> list[Endpoint]:
    """Preprocessing hook: the schema covers ``/v1/`` and ``/internal/`` and nothing else
    (not the probes, the admin, or the schema view itself)."""
    return [endpoint for endpoint in endpoints if endpoint[0].startswith(("/v1/", "/internal/"))]
