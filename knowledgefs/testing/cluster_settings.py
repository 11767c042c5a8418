"""Settings for a ``manage.py qcluster`` started by the fault tests against the test database.

The parent test passes the test database name, the object folder and the timings in the
environment; everything else is the product's own settings.
"""

import os
from pathlib import Path

from knowledgefs.runtime import DEFAULT_MODEL_ID
from knowledgefs.settings import *  # noqa: F403
from knowledgefs.settings import DATABASES, MIDDLEWARE, Q_CLUSTER

DATABASES["default"]["NAME"] = os.environ["KFS_TEST_DB_NAME"]
if os.environ.get("KFS_TEST_VAR_DIR"):  # the parent test's derived files (keyword indexes)
    VAR_DIR = Path(os.environ["KFS_TEST_VAR_DIR"])
DATABASES["default"]["CONN_MAX_AGE"] = 0
if os.environ.get("KFS_TEST_DIFY_OBJECTS"):  # objects through Dify's storage (the product's)
    _objects_dir = None
else:
    _objects_dir = os.environ["KFS_TEST_OBJECTS"]
STORAGES = {  # noqa: F405
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "objects": {
        "BACKEND": "knowledgefs.testing.cluster_support.SlowFileSystemStorage",
        "OPTIONS": {"location": _objects_dir},
    },
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
if _objects_dir is None:
    from knowledgefs.boundary import objects_storage

    STORAGES["objects"] = objects_storage("dify", "")
KNOWLEDGE_EMBEDDING_MODELS = {DEFAULT_MODEL_ID: "knowledgefs.testing.cluster_support.SlowEmbedder"}
Q_CLUSTER = {
    **Q_CLUSTER,
    "workers": int(os.environ.get("KFS_TEST_WORKERS", "2")),
    "timeout": int(os.environ.get("KFS_TEST_Q_TIMEOUT", Q_CLUSTER["timeout"])),
    "retry": int(os.environ.get("KFS_TEST_Q_RETRY", Q_CLUSTER["retry"])),
    "poll": float(os.environ.get("KFS_TEST_Q_POLL", "0.2")),
}
if os.environ.get("KFS_TEST_GZIP"):  # a deployment that compresses responses in Django
    MIDDLEWARE = ["django.middleware.gzip.GZipMiddleware", *MIDDLEWARE]
