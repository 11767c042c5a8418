from django.apps import AppConfig


class FailingMigrationConfig(AppConfig):
    """Installed only by ``knowledgefs.testing.settings_failing_migration``."""

    name = "knowledgefs.testing.failing_migration_app"
    label = "failing_migration_app"
