"""Re-exports for callers not yet moved (now :mod:`upgrades.api.serializers`)."""

from upgrades.api.serializers import (  # noqa: F401
    ListQuerySerializer,
    NamespaceQuerySerializer,
    SnapshotSerializer,
    UpgradeDocumentSerializer,
    UpgradeJobSerializer,
)
