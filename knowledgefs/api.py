"""The base of Dify's internal views (``/internal/…``), authenticated by ``X-Inner-Api-Key`` only.

They name the tenant in the body (``namespace_id``) because the inner API key belongs to Dify,
not to a tenant. Product credentials (API keys, capability tokens) are never accepted there, and
the inner API key is never accepted on product routes. The apps' internal views subclass
:class:`InternalView` and declare their operations with :func:`internal`.
"""

from __future__ import annotations

from rest_framework.views import APIView

from .auth.authentication import InnerApiKeyAuthentication
from .auth.operations import Binding, Operation

NO_CALLERS: frozenset[str] = frozenset()


def internal(action: str, binding: Binding | None = None) -> Operation:
    """An operation reached only with the inner API key."""
    return Operation(action, binding or Binding(type="namespace", source="none"), NO_CALLERS, True)


class InternalView(APIView):
    authentication_classes = [InnerApiKeyAuthentication]
