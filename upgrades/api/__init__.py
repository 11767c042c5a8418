"""The upgrade bridge's internal routes: :mod:`.views` (``/internal/dataset-upgrades``,
``/internal/upgrade-file-leases``), :mod:`.cutover` (``/internal/workspaces/{id}/cutover``) and
their request and response shapes (:mod:`.serializers`); routed by :mod:`upgrades.urls`.

The names below are re-exports for callers not yet moved (``upgrades.api.<View>`` dotted paths).
"""

from .views import (  # noqa: F401
    FileLeaseView,
    UpgradeAbandonView,
    UpgradeDetailView,
    UpgradeListView,
    UpgradeRetryView,
)
