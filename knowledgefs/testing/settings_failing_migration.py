"""Settings for the failing-migration case (BC-30): the project's settings plus an app whose
migration fails, on the database named by ``KFS_TEST_DB_NAME`` (a throw-away one)."""

import os

from knowledgefs.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "knowledgefs.testing.failing_migration_app"]  # noqa: F405
DATABASES["default"]["NAME"] = os.environ["KFS_TEST_DB_NAME"]  # noqa: F405
