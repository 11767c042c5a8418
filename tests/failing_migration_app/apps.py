from django.apps import AppConfig


class FailingMigrationConfig(AppConfig):
    """Installed only by ``tests.settings_failing_migration``."""

    name = "tests.failing_migration_app"
    label = "failing_migration_app"
