"""The values one answer carries through its run: who asks (:class:`Requester`), how the
answer is written (:class:`Generator`) and the answer in progress (:class:`AnswerRun`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from retrieval import evidence as ev
from retrieval.models import AnswerTrace

if TYPE_CHECKING:
    from spaces.models import KnowledgeSpace
    from spaces.selection import Selection

    from ..recall import RetrievalResult


@dataclass
class Requester:
    """Who asks: ``kind`` (``api_key``, ``capability``, ``operator``), ``owner`` label, the
    API key or capability grant behind it, Dify's ``caller_kind`` of a token and the spaces the
    caller reaches (``space_ids``, ``None``: the whole tenant): the provenance the quality loop
    keeps (:mod:`retrieval.quality`)."""

    tenant_id: str
    kind: str
    owner: str
    api_key_id: uuid.UUID | None = None
    grant_id: str = ""
    caller_kind: str = ""
    space_ids: frozenset | None = None

    @classmethod
    def of(cls, principal) -> Requester:
        return cls(
            tenant_id=principal.tenant_id,
            kind=principal.kind,
            owner=principal.owner,
            api_key_id=principal.api_key_id,
            grant_id=principal.grant_id or "",
            caller_kind=principal.caller_kind or "",
            space_ids=principal.space_ids,
        )


@dataclass
class Generator:
    """How the answer is written: ``kind`` ``llm`` (with ``selection``) or ``extractive``."""

    kind: str
    selection: Selection | None = None

    @property
    def model(self) -> str | None:
        return str(self.selection) if self.selection is not None else None


@dataclass
class AnswerRun:
    """One answer in progress: the request, the retrieval result, the packed bundle, the
    generator, and the trace row (``trace.id`` is the query run id)."""

    space: KnowledgeSpace
    query: str
    result: RetrievalResult
    bundle: ev.Bundle
    generator: Generator
    trace: AnswerTrace
    steps: list[dict] = field(default_factory=list)
    removed: ev.Removals = field(default_factory=ev.Removals)
    requester: Requester | None = None

    @property
    def trace_id(self) -> str:
        return str(self.trace.id)
