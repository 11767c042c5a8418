"""The upgrade bridge's internal routes: :mod:`.views` (``/internal/dataset-upgrades``,
``/internal/upgrade-file-leases``), :mod:`.cutover` (``/internal/workspaces/{id}/cutover``) and
their request and response shapes (:mod:`.serializers`); routed by :mod:`upgrades.urls`."""
