"""The base of Dify's internal views (``/internal/…``), authenticated by ``X-Inner-Api-Key`` only.

They name the tenant in the body (``namespace_id``) because the inner API key belongs to Dify,
not to a tenant. Product credentials (API keys, capability tokens) are never accepted there, and
the inner API key is never accepted on product routes. The apps' internal views subclass
:class:`InternalView` and declare their operations with :func:`internal`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.views import APIView

from .auth.authentication import InnerApiKeyAuthentication
from .auth.operations import Binding, Operation
from .errors import Conflict

NO_CALLERS: frozenset[str] = frozenset()


def internal(action: str, binding: Binding | None = None) -> Operation:
    """An operation reached only with the inner API key."""
    return Operation(action, binding or Binding(type="namespace", source="none"), NO_CALLERS, True)


class InternalView(APIView):
    """``integrated_mode`` views (Workspace provisioning and cutover) answer 409
    ``integrated_mode_disabled`` while ``KNOWLEDGE_INTEGRATED_MODE_ENABLED`` is off, after the
    inner key was checked."""

    authentication_classes = [InnerApiKeyAuthentication]
    integrated_mode = False

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        if self.integrated_mode and not settings.KNOWLEDGE_INTEGRATED_MODE_ENABLED:
            raise Conflict(
                "Workspace provisioning and cutover are off: set "
                "KNOWLEDGE_INTEGRATED_MODE_ENABLED=true to use this route",
                code="integrated_mode_disabled",
            )
