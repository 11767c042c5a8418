"""Internal routes of the upgrade bridge (the workspace cutover ledger, dataset upgrades, file
leases), included under ``/internal/`` by knowledgefs.urls."""

from django.urls import path

from .api import cutover, views

urlpatterns = [
    # Workspace cutover ledger.
    path(
        "workspaces/<str:namespace_id>/cutover",
        cutover.LedgerView.as_view(),
        name="internal-cutover-ledger",
    ),
    path(
        "workspaces/<str:namespace_id>/cutover/advance",
        cutover.AdvanceView.as_view(),
        name="internal-cutover-advance",
    ),
    path(
        "workspaces/<str:namespace_id>/cutover/rollback",
        cutover.RollbackView.as_view(),
        name="internal-cutover-rollback",
    ),
    path(
        "workspaces/<str:namespace_id>/cutover/recutover",
        cutover.RecutoverView.as_view(),
        name="internal-cutover-recutover",
    ),
    # Dataset upgrades and their file leases.
    path("dataset-upgrades", views.UpgradeListView.as_view(), name="internal-upgrade-list"),
    path(
        "dataset-upgrades/<str:upgrade_id>",
        views.UpgradeDetailView.as_view(),
        name="internal-upgrade-detail",
    ),
    path(
        "dataset-upgrades/<str:upgrade_id>/retry",
        views.UpgradeRetryView.as_view(),
        name="internal-upgrade-retry",
    ),
    path(
        "dataset-upgrades/<str:upgrade_id>/abandon",
        views.UpgradeAbandonView.as_view(),
        name="internal-upgrade-abandon",
    ),
    path(
        "upgrade-file-leases/<str:upload_file_id>",
        views.FileLeaseView.as_view(),
        name="internal-upgrade-file-lease",
    ),
]
