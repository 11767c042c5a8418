"""Internal routes through which Dify drives a workspace's cutover ledger (inner API key only).

All under ``/internal/workspaces/{namespace_id}/cutover``; answers are the ledger as
:func:`upgrades.services.cutover.ledger_as_dict` prints it (with ``gate``). Thin: every rule is
in :mod:`upgrades.services.cutover`.
"""

from __future__ import annotations

from rest_framework import serializers, status
from rest_framework.response import Response

from knowledgefs.api import InternalView, internal

from ..services import cutover


class AdvanceSerializer(serializers.Serializer):
    expected_phase = serializers.CharField(max_length=32)
    expected_cas_version = serializers.IntegerField(min_value=0)
    to_phase = serializers.CharField(max_length=32)
    ack = serializers.JSONField(required=False, default=None)
    smoke_results = serializers.JSONField(required=False, default=None)


class RollbackSerializer(serializers.Serializer):
    expected_phase = serializers.CharField(max_length=32)
    expected_cas_version = serializers.IntegerField(min_value=0)


class RecutoverSerializer(serializers.Serializer):
    expected_cas_version = serializers.IntegerField(min_value=0)
    ack = serializers.JSONField()


def _body(serializer_class, request) -> dict:
    body = serializer_class(data=request.data)
    body.is_valid(raise_exception=True)
    return body.validated_data


class LedgerView(InternalView):
    integrated_mode = True
    operations = {
        "GET": internal("internal.workspace_cutover.read"),
        "POST": internal("internal.workspace_cutover.create"),
    }

    def get(self, request, namespace_id):
        """The ledger with its gate; 404 ``ledger_not_found``."""
        return Response(cutover.ledger_as_dict(cutover.get_ledger(namespace_id)))

    def post(self, request, namespace_id):
        """Create the ledger (201) or return the existing one (200)."""
        ledger, created = cutover.create_ledger(namespace_id)
        return Response(
            cutover.ledger_as_dict(ledger),
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class AdvanceView(InternalView):
    integrated_mode = True
    operations = {"POST": internal("internal.workspace_cutover.advance")}

    def post(self, request, namespace_id):
        """One forward step: ``{expected_phase, expected_cas_version, to_phase, ack?,
        smoke_results?}``."""
        data = _body(AdvanceSerializer, request)
        ledger = cutover.advance(namespace_id, **data)
        return Response(cutover.ledger_as_dict(ledger))


class RollbackView(InternalView):
    integrated_mode = True
    operations = {"POST": internal("internal.workspace_cutover.rollback")}

    def post(self, request, namespace_id):
        """Roll back to frozen: ``{expected_phase, expected_cas_version}``."""
        ledger = cutover.rollback(namespace_id, **_body(RollbackSerializer, request))
        return Response(cutover.ledger_as_dict(ledger))


class RecutoverView(InternalView):
    integrated_mode = True
    operations = {"POST": internal("internal.workspace_cutover.recutover")}

    def post(self, request, namespace_id):
        """Cut a rolled-back workspace over again: ``{expected_cas_version, ack}``."""
        ledger = cutover.recutover(namespace_id, **_body(RecutoverSerializer, request))
        return Response(cutover.ledger_as_dict(ledger))
