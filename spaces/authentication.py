"""DRF authentication with tenant-bound API keys (``Authorization: Bearer kfs_…``)."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from .key_auth import authenticate_secret


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """Sets ``request.user`` to a :class:`knowledgefs.auth.principal.Principal` of kind
    ``api_key``, scoped by the key's bindings (:func:`spaces.key_auth.authenticate_secret`,
    which caches the result until the key is revoked or its bindings change). An unknown or
    revoked key is 401 ``authentication_failed``; the secret is never logged."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise exceptions.AuthenticationFailed("use 'Authorization: Bearer <api key>'")
        principal = authenticate_secret(secret.strip())
        if principal is None:
            raise exceptions.AuthenticationFailed("invalid or revoked API key")
        return principal, principal.api_key_id

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="knowledgefs"'
