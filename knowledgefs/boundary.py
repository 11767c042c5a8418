"""Start-up rules of the Dify boundary, applied by ``knowledgefs/settings/``.

- **Forbidden credentials.** KnowledgeFS must never receive model-provider keys, datasource
  secrets, direct plugin-daemon credentials or object-storage provider credentials (production
  deployment guide, "Dependency ownership"): Dify holds them. :data:`FORBIDDEN_CREDENTIALS` is
  the rule, one family per row; :func:`refuse_forbidden_credentials` stops start-up naming every
  variable that matches (never its value).
- **Runtime selection.** ``KNOWLEDGE_MODEL_RUNTIME`` is ``local`` (the embedded default: local
  files under ``KNOWLEDGE_OBJECT_STORAGE_DIR``, the local ONNX embedding model, no reranker, no
  LLM, no datasources) or ``dify`` (models, object storage and datasources through Dify's inner
  API; needs ``DIFY_INNER_API_URL`` and ``DIFY_INNER_API_KEY``).

Settings import this module before Django is set up, so it imports nothing from Django but the
exception. Every refusal is an ``ImproperlyConfigured`` naming the variable, so ``manage.py``,
gunicorn and the django-q2 cluster all stop with the same message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

# --- forbidden credentials --------------------------------------------------------------------


@dataclass(frozen=True)
class CredentialFamily:
    """Environment variables of one kind of credential that Dify owns.

    A variable belongs to the family when its name (compared in upper case) is one of ``names``,
    starts with one of ``prefixes`` or ends with one of ``suffixes``. ``owner`` says who holds
    such credentials instead, for the refusal message.
    """

    family: str
    owner: str
    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    suffixes: tuple[str, ...] = ()

    def matches(self, name: str) -> bool:
        upper = name.upper()
        return (
            upper in self.names or upper.startswith(self.prefixes) or upper.endswith(self.suffixes)
        )


#: The rule. Prefix families (``MINIO_``, ``S3_``, ``PLUGIN_DAEMON_``, ``NOTION_``…) are refused
#: whole: KnowledgeFS never configures those systems, so none of their variables belongs here.
#: Suffix families catch credentials of any provider by the shape of their name.
FORBIDDEN_CREDENTIALS: tuple[CredentialFamily, ...] = (
    CredentialFamily(
        family="model-provider or service API key",
        owner="Dify's model manager and plugin daemon hold provider keys",
        suffixes=("_API_KEY", "_API_TOKEN", "_API_KEY_FILE"),  # OPENAI_API_KEY, …
        # Model providers' own variables, whatever their shape (OPENAI_KEY, GEMINI_…): we
        # never configure a provider, so nothing under these prefixes belongs here.
        prefixes=(
            "OPENAI_",
            "AZURE_OPENAI_",
            "ANTHROPIC_",
            "COHERE_",
            "MISTRAL_",
            "GROQ_",
            "GEMINI_",
            "GOOGLE_API_",
            "GOOGLE_GENAI_",
            "VOYAGE_",
            "JINA_",
            "DEEPSEEK_",
            "DASHSCOPE_",
            "ZHIPUAI_",
            "MOONSHOT_",
            "TOGETHER_",
            "FIREWORKS_",
            "PERPLEXITY_",
            "REPLICATE_",
            "HUGGINGFACEHUB_",
        ),
        names=frozenset(
            {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AZURE_OPENAI_KEY", "AZURE_OPENAI_AD_TOKEN"}
        ),
    ),
    CredentialFamily(
        family="object-storage credential or configuration",
        owner="Dify's STORAGE_TYPE holds physical storage, reached through Dify's storage API",
        prefixes=(
            "MINIO_",
            "S3_",
            "AZURE_STORAGE_",
            "AZURE_BLOB_",
            "GOOGLE_STORAGE_",
            "ALIYUN_OSS_",
            "TENCENT_COS_",
            "HUAWEI_OBS_",
            "BAIDU_OBS_",
            "VOLCENGINE_TOS_",
            "OPENDAL_",
            "CLICKZETTA_",
            "SUPABASE_",
        ),
        names=frozenset(
            {
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN",
                "AWS_SECURITY_TOKEN",
                "GOOGLE_APPLICATION_CREDENTIALS",
                "OCI_ACCESS_KEY",
                "OCI_SECRET_KEY",
            }
        ),
    ),
    CredentialFamily(
        family="plugin daemon credential or endpoint",
        owner="only Dify talks to its plugin daemon",
        prefixes=("PLUGIN_DAEMON_",),
    ),
    CredentialFamily(
        family="datasource token or OAuth secret",
        owner="Dify's datasource plugins hold connections; KnowledgeFS names them by credential_id",
        prefixes=("NOTION_", "FIRECRAWL_", "WATERCRAWL_"),
        suffixes=("_CLIENT_SECRET", "_ACCESS_TOKEN", "_REFRESH_TOKEN"),
    ),
)

#: Our own variables that a family's shape would otherwise catch. Nothing else is exempt.
OWN_CREDENTIALS: dict[str, str] = {
    "DIFY_INNER_API_KEY": "the inner key shared with Dify (its INNER_API_KEY_FOR_PLUGIN)",
    "UNSTRUCTURED_API_KEY": "the document parser's key (production guide, operator-owned)",
}


def forbidden_credentials(environ: Mapping[str, str]) -> list[tuple[str, CredentialFamily]]:
    """``(name, family)`` for every variable of ``environ`` that holds a credential Dify owns,
    sorted by name. Empty (or blank) variables hold nothing and pass, so a Compose file's
    ``${X:-}`` is harmless; names in :data:`OWN_CREDENTIALS` always pass."""
    found = []
    for name, value in environ.items():
        if not (value or "").strip() or name.upper() in OWN_CREDENTIALS:
            continue
        family = next((f for f in FORBIDDEN_CREDENTIALS if f.matches(name)), None)
        if family is not None:
            found.append((name, family))
    return sorted(found, key=lambda item: item[0])


def refuse_forbidden_credentials(environ: Mapping[str, str]) -> None:
    """Raise ``ImproperlyConfigured`` naming each forbidden variable, its family and who owns
    such credentials. Values are never repeated."""
    found = forbidden_credentials(environ)
    if found:
        listed = "; ".join(f"{name} ({family.family}: {family.owner})" for name, family in found)
        raise ImproperlyConfigured(
            "KnowledgeFS must not hold credentials that Dify owns; remove these variables from "
            f"its environment: {listed}. See docs/configuration.md, 'Forbidden credentials'."
        )


# --- runtime selection ------------------------------------------------------------------------

LOCAL = "local"
DIFY = "dify"
RUNTIMES = (LOCAL, DIFY)

#: ``STORAGES["objects"]["BACKEND"]`` under ``KNOWLEDGE_MODEL_RUNTIME=dify``.
DIFY_OBJECT_STORAGE_BACKEND = "knowledgefs.dify.object_storage.DifyObjectStorage"
LOCAL_OBJECT_STORAGE_BACKEND = "django.core.files.storage.FileSystemStorage"


def parse_model_runtime(value: str | None) -> str:
    """``KNOWLEDGE_MODEL_RUNTIME`` → ``"local"`` or ``"dify"`` (unset or empty → ``"local"``;
    surrounding spaces and case are ignored). Anything else raises ``ImproperlyConfigured``
    naming the variable, the value and the accepted values."""
    runtime = (value or "").strip().lower() or LOCAL
    if runtime not in RUNTIMES:
        raise ImproperlyConfigured(
            f"KNOWLEDGE_MODEL_RUNTIME={value!r} is not supported; accepted values: "
            + ", ".join(RUNTIMES)
        )
    return runtime


def require_dify_settings(runtime: str, *, inner_api_url: str, inner_api_key: str) -> None:
    """Under ``dify``, refuse start-up when ``DIFY_INNER_API_URL`` or ``DIFY_INNER_API_KEY`` is
    missing; the message names every missing variable (never a value)."""
    if runtime != DIFY:
        return
    missing = [
        name
        for name, value in (
            ("DIFY_INNER_API_URL", inner_api_url),
            ("DIFY_INNER_API_KEY", inner_api_key),
        )
        if not (value or "").strip()
    ]
    if missing:
        raise ImproperlyConfigured(
            f"KNOWLEDGE_MODEL_RUNTIME=dify needs {' and '.join(missing)}: models, object "
            "storage and datasources are reached through Dify's inner API "
            "(Compose injects DIFY_INNER_API_URL=http://api:5001 and the inner key)"
        )


def objects_storage(runtime: str, location: str) -> dict[str, Any]:
    """The ``STORAGES["objects"]`` entry for ``runtime``: ``FileSystemStorage`` under
    ``location`` for ``local``, :class:`~knowledgefs.dify.object_storage.DifyObjectStorage`
    (which reads the ``DIFY_*`` settings when it is built) for ``dify``."""
    if runtime == DIFY:
        return {"BACKEND": DIFY_OBJECT_STORAGE_BACKEND}
    return {"BACKEND": LOCAL_OBJECT_STORAGE_BACKEND, "OPTIONS": {"location": str(location)}}
