"""Internal routes of the upgrade bridge, included under ``/internal/`` by knowledgefs.urls."""

from django.urls import path

from . import api

urlpatterns = [
    path("dataset-upgrades", api.UpgradeListView.as_view(), name="internal-upgrade-list"),
    path(
        "dataset-upgrades/<str:upgrade_id>",
        api.UpgradeDetailView.as_view(),
        name="internal-upgrade-detail",
    ),
    path(
        "dataset-upgrades/<str:upgrade_id>/retry",
        api.UpgradeRetryView.as_view(),
        name="internal-upgrade-retry",
    ),
    path(
        "dataset-upgrades/<str:upgrade_id>/abandon",
        api.UpgradeAbandonView.as_view(),
        name="internal-upgrade-abandon",
    ),
    path(
        "upgrade-file-leases/<str:upload_file_id>",
        api.FileLeaseView.as_view(),
        name="internal-upgrade-file-lease",
    ),
]
