"""KnowledgeFS settings, read from the environment (the package Django loads by name).

With no environment set this is the embedded default: SQLite in ``var/`` (WAL mode), django-q2 on
the ORM broker, objects under ``var/objects/`` and the local ONNX embedding model. Every variable
is documented in ``docs/configuration.md``; ``scripts/settings_table.py`` reads the text of the
modules imported below, in this order (their section banners and environment reads), to generate
the operator table.

Sections run in domain order across the modules: ``platform`` (the process and Django's own
settings, the database, cache and callers), ``runtime`` (Dify and the runtime boundary),
``ingestion`` (uploads, ingestion and the worker queue) and ``retrieval`` (search backends,
retrieval and the upgrade bridge); each module imports by name what it needs of an earlier one
and the environment readers of ``values``. Each setting (and each dict: ``INSTALLED_APPS``,
``DATABASES``, ``CACHES``, ``STORAGES``, ``Q_CLUSTER``, ``REST_FRAMEWORK``) is written once, in
its section. A malformed value is refused where it is read (``bounded_int`` and the ``parse_*``
helpers); the checks across settings run last, in :func:`validation.validate`, and raise
``ImproperlyConfigured`` at import.
"""

# The modules run in domain order: a later one reads settings of an earlier one.
# isort: off
from knowledgefs.settings.platform import *  # noqa: F403
from knowledgefs.settings.runtime import *  # noqa: F403
from knowledgefs.settings.ingestion import *  # noqa: F403
from knowledgefs.settings.retrieval import *  # noqa: F403
from knowledgefs.settings.multimodal import *  # noqa: F403

# isort: on
from knowledgefs.settings.validation import validate

validate()
