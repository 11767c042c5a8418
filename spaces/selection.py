"""Space-profile values: model selections, the retrieval profile's members and revisions.

No database: a :class:`Selection` is what a client chose (``{plugin_id, provider, model}``),
:func:`parse_selection` and :func:`parse_retrieval_profile` check a request body against the
runtime's capabilities (400s naming the member), :func:`vector_space_id` names the vector space a
selection and its observed identity fill. The rows that hold them are :mod:`spaces.profiles`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from knowledgefs.errors import Conflict, InvalidInput
from knowledgefs.runtime import (
    LOCAL_PLUGIN_ID,
    LOCAL_PROVIDER,
    VECTOR_SPACE_PREFIX,
    default_model_id,
    is_registered,
    registered_model_ids,
    runtime_name,
)

from .models import RetrievalMode, SpaceProfile

FIELDS = ("embedding", "rerank", "reasoning")
MAX_TOP_K = 100
DEFAULT_TOP_K = 10
DISTANCE_METRIC = "cosine"
_PLUGIN_ID = re.compile(r"[a-z0-9_-]+/[a-z0-9_-]+")
_PROVIDER = re.compile(r"[a-z0-9_-]+")
MODEL_TYPE = {"embedding": "text-embedding", "rerank": "rerank", "reasoning": "llm"}
_SELECTION_KEYS = ("plugin_id", "provider", "model")
_RETRIEVAL_KEYS = {"default_mode", "reasoning_model", "rerank", "score_threshold", "top_k"}


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """A model chosen by a client: ``plugin_id`` (``<org>/<plugin>``, or ``local``),
    ``provider`` and ``model``. Never a credential, a dimension or a vector space."""

    plugin_id: str
    provider: str
    model: str

    @classmethod
    def of(cls, value: Any) -> Selection | None:
        if not isinstance(value, dict):
            return None
        return cls(value["plugin_id"], value["provider"], value["model"])

    def as_dict(self) -> dict[str, str]:
        return {"plugin_id": self.plugin_id, "provider": self.provider, "model": self.model}

    @property
    def is_local(self) -> bool:
        return self.plugin_id == LOCAL_PLUGIN_ID

    @property
    def canonical_provider(self) -> str:
        """``<org>/<plugin>/<provider>``, the form Dify's invocations take."""
        return f"{self.plugin_id}/{self.provider}"

    def __str__(self) -> str:
        return f"{self.canonical_provider}/{self.model}"


def local_selection(model_id: str | None = None) -> Selection:
    """The local selection of ``model_id`` (the model new spaces get without one)."""
    return Selection(LOCAL_PLUGIN_ID, LOCAL_PROVIDER, model_id or default_model_id())


def vector_space_id(selection: Selection, identity: dict) -> str:
    """``embedding-space-sha256:<hex>``: SHA-256 of the stable JSON (sorted keys, no spaces,
    UTF-8) of ``{"selection": {plugin_id, provider, model}, "identity": identity}``.

    ``identity`` is what the runtime reports about the model it serves: for Dify
    ``{plugin_unique_identifier, dimension, distance_metric}`` (so a plugin upgraded in place, or
    another dimension, is another vector space); for a local model ``{model_id}`` (a registered
    id names the model and its revision).
    """
    payload = json.dumps(
        {"selection": selection.as_dict(), "identity": identity},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return VECTOR_SPACE_PREFIX + hashlib.sha256(payload.encode()).hexdigest()


def local_identity(model_id: str) -> dict:
    return {"model_id": model_id}


def embedding_selection(profile: SpaceProfile) -> Selection | None:
    if not profile.embedding_plugin_id:
        return None
    return Selection(
        profile.embedding_plugin_id, profile.embedding_provider, profile.embedding_model
    )


def index_model_id(profile: SpaceProfile) -> str:
    """The model id an index version filled by this profile carries: the registered id for a
    local model, the vector space id for a model served through Dify."""
    if profile.embedding_plugin_id == LOCAL_PLUGIN_ID:
        return profile.embedding_model
    return profile.vector_space_id


# --- input ----------------------------------------------------------------------------------


def _capability_unavailable(field: str, message: str) -> InvalidInput:
    return InvalidInput(
        f"{field}: {message}", code="capability_unavailable", details={"field": field}
    )


def parse_selection(value: Any, field: str) -> Selection:
    """Check a selection ``{plugin_id, provider, model}`` (exactly these members) against the
    runtime; 400 ``invalid_model_selection`` naming the member, ``capability_unavailable`` when
    this runtime cannot serve it."""
    if not isinstance(value, dict):
        raise InvalidInput(
            f"{field} must be an object {{plugin_id, provider, model}}",
            code="invalid_model_selection",
            details={"field": field},
        )
    extra = sorted(set(value) - set(_SELECTION_KEYS))
    if extra:
        raise InvalidInput(
            f"{field}.{extra[0]}: a selection names only plugin_id, provider and model "
            "(credentials, dimensions and vector spaces are never set by clients)",
            code="invalid_model_selection",
            details={"field": f"{field}.{extra[0]}"},
        )
    for key in _SELECTION_KEYS:
        item = value.get(key)
        if not isinstance(item, str) or not item.strip():
            raise InvalidInput(
                f"{field}.{key} is required (a non-empty string)",
                code="invalid_model_selection",
                details={"field": f"{field}.{key}"},
            )
    plugin_id, provider, model = (value[k].strip() for k in _SELECTION_KEYS)
    if len(model) > 256 or any(unicodedata.category(c) in ("Cc", "Cf") for c in model):
        raise InvalidInput(
            f"{field}.model must be at most 256 characters without control characters",
            code="invalid_model_selection",
            details={"field": f"{field}.model"},
        )
    selection = Selection(plugin_id, provider, model)
    runtime = runtime_name()
    if selection.is_local:
        if runtime != "local":
            raise _capability_unavailable(
                f"{field}.plugin_id",
                f"local models are served only with KNOWLEDGE_MODEL_RUNTIME=local; this server "
                f"runs {runtime!r}: select a model of a Dify plugin",
            )
        if field != "embedding":
            raise _capability_unavailable(
                field, f"no local {MODEL_TYPE[field]} model exists; leave {field} unset"
            )
        if provider != LOCAL_PROVIDER:
            raise InvalidInput(
                f"{field}.provider must be 'local' with plugin_id 'local'",
                code="invalid_model_selection",
                details={"field": f"{field}.provider"},
            )
        if not is_registered(model):
            raise InvalidInput(
                f"{field}.model: no local embedding model is registered as {model!r}",
                code="unknown_embedding_model",
                details={"field": f"{field}.model", "registered": sorted(registered_model_ids())},
            )
        return selection
    if runtime == "local":
        what = "embedding models" if field == "embedding" else f"{MODEL_TYPE[field]} models"
        raise _capability_unavailable(
            f"{field}.plugin_id" if field == "embedding" else field,
            f"this server runs KNOWLEDGE_MODEL_RUNTIME=local, which serves no {what} of Dify "
            f"plugins"
            + (
                f" (use plugin_id 'local', provider 'local', model {default_model_id()!r})"
                if field == "embedding"
                else f"; leave {field} unset"
            ),
        )
    if len(plugin_id) > 128 or not _PLUGIN_ID.fullmatch(plugin_id):
        raise InvalidInput(
            f"{field}.plugin_id must be '<org>/<plugin>' in lower case (langgenius/openai)",
            code="invalid_model_selection",
            details={"field": f"{field}.plugin_id"},
        )
    if len(provider) > 128 or not _PROVIDER.fullmatch(provider):
        raise InvalidInput(
            f"{field}.provider must be a provider name in lower case (openai)",
            code="invalid_model_selection",
            details={"field": f"{field}.provider"},
        )
    return selection


def parse_retrieval_profile(body: Any) -> dict:
    """Check a retrieval profile and return the model fields to store.

    Members (each optional, a missing one takes its default — ``PUT`` replaces the profile):
    ``default_mode`` (``fast``, ``deep`` or ``research``; ``auto`` is refused with
    ``mode_unavailable``: it resolves to the default), ``reasoning_model`` (selection or null),
    ``rerank`` (``{enabled: false, model: null}``), ``score_threshold`` (null = off, else 0..1),
    ``top_k`` (10; 1..100). Each rule refused is a 400 naming the field (codes: docs/api.md,
    "Space profiles"). An enabled rerank needs a model; a threshold needs an enabled rerank,
    whatever ``default_mode`` (the profile's threshold applies in every mode, and without a
    reranker every mode's scores are relative to the query's candidates; a request's own
    ``score_threshold`` stays allowed); the local runtime serves no rerank or reasoning model.
    """
    modes = RetrievalMode.concrete()
    if not isinstance(body, dict):
        raise InvalidInput("the body must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - _RETRIEVAL_KEYS - {"revision"})
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not a retrieval profile member (members: "
            f"{', '.join(sorted(_RETRIEVAL_KEYS))})",
            code="invalid_request",
            details={"field": unknown[0]},
        )
    mode = body.get("default_mode", RetrievalMode.FAST.value)
    if not isinstance(mode, str) or mode not in RetrievalMode.values:
        raise InvalidInput(
            f"default_mode must be one of: {', '.join(modes)}",
            code="invalid_mode",
            details={"field": "default_mode"},
        )
    if mode not in modes:
        raise InvalidInput(
            f"default_mode: {mode!r} cannot be a default (auto resolves to the default); "
            f"supported: {', '.join(modes)}",
            code="mode_unavailable",
            details={"field": "default_mode", "supported": list(modes)},
        )
    top_k = body.get("top_k", DEFAULT_TOP_K)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise InvalidInput(
            f"top_k must be an integer from 1 to {MAX_TOP_K}",
            code="invalid_top_k",
            details={"field": "top_k"},
        )
    threshold = body.get("score_threshold")
    if threshold is not None and (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not math.isfinite(threshold)
        or not 0 <= threshold <= 1
    ):
        raise InvalidInput(
            "score_threshold must be null (off) or a number from 0 to 1",
            code="invalid_score_threshold",
            details={"field": "score_threshold"},
        )
    rerank = body.get("rerank", {"enabled": False, "model": None})
    if rerank is None:
        rerank = {"enabled": False, "model": None}
    if not isinstance(rerank, dict) or set(rerank) - {"enabled", "model"}:
        raise InvalidInput(
            "rerank must be an object {enabled, model}",
            code="invalid_rerank",
            details={"field": "rerank"},
        )
    enabled = rerank.get("enabled", False)
    if not isinstance(enabled, bool):
        raise InvalidInput(
            "rerank.enabled must be true or false",
            code="invalid_rerank",
            details={"field": "rerank.enabled"},
        )
    rerank_model = rerank.get("model")
    if enabled and rerank_model is None:
        raise InvalidInput(
            "rerank.model is required when rerank is enabled",
            code="rerank_model_required",
            details={"field": "rerank.model"},
        )
    rerank_selection = None if rerank_model is None else parse_selection(rerank_model, "rerank")
    reasoning = body.get("reasoning_model")
    reasoning_selection = None if reasoning is None else parse_selection(reasoning, "reasoning")
    if threshold is not None and not enabled:
        # Whatever the default mode: the profile's threshold applies to every request that
        # sends none, in any mode, and without a reranker no mode's score is absolute.
        raise InvalidInput(
            "score_threshold: a profile threshold applies to the rerank score; enable rerank "
            "with a model, or set score_threshold to null (a request may still send its own)",
            code="score_threshold_requires_rerank",
            details={"field": "score_threshold"},
        )
    return {
        "retrieval_default_mode": mode,
        "retrieval_reasoning_model": reasoning_selection.as_dict() if reasoning_selection else None,
        "retrieval_rerank_enabled": enabled,
        "retrieval_rerank_model": rerank_selection.as_dict() if rerank_selection else None,
        "retrieval_score_threshold": None if threshold is None else float(threshold),
        "retrieval_top_k": top_k,
    }


def check_revision(current: int, expected: int | None, what: str) -> None:
    """409 ``revision_conflict`` unless ``expected`` is None or the ``current`` revision."""
    if expected is not None and expected != current:
        raise Conflict(
            f"the {what} changed since revision {expected} (now {current}); re-read it and retry",
            code="revision_conflict",
            details={"revision": current},
        )


def parse_revision(revision: Any) -> int | None:
    """A client's expected revision: None, or a positive integer (else 400)."""
    if revision is None:
        return None
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
        raise InvalidInput(
            "revision must be a positive integer",
            code="invalid_request",
            details={"field": "revision"},
        )
    return revision
