"""Cited answers: retrieval → evidence bundle → generation → citation normalisation → events.

:func:`start` does everything that can refuse a request before any byte of an answer is sent:
it validates, retrieves through :func:`retrieval.modes.retrieve`, packs the evidence
(:mod:`retrieval.evidence`), sets the answerability state and writes the :class:`AnswerTrace`
row (``completed=False``). Its errors are ordinary :class:`~knowledgefs.errors.ServiceError`
values (400/404/409/503 JSON). :func:`events` then generates the answer and yields
``(event, payload)`` pairs; the API's ``sse`` (:mod:`retrieval.api.answers`) encodes them as
``text/event-stream``.

Generation (docs/retrieval.md, "Answers"):

- **LLM**: the space's reasoning model (profile ``retrieval_reasoning_model``) through
  :func:`knowledgefs.runtime.model_runtime` ``invoke_llm`` with no tools, a system prompt that
  allows citing evidence only by its markers and treats evidence as untrusted data, and
  ``max_tokens`` = the window's output reservation. Deltas are streamed as they arrive.
- **Extractive** (no reasoning model: the embedded default): the best supporting sentences of
  the packed evidence (:func:`extract`), each followed by its marker.

Both go through :class:`CitationNormaliser`, so the concatenated ``answer.delta`` texts equal
``answer.done``'s ``answer``: markers ``[E<n>]`` with no such evidence are removed (with the
whitespace before them) and reported in ``orphan_markers``; a marker repeating the marker just
before it is collapsed; the answer is cut at ``KNOWLEDGE_ANSWER_MAX_BYTES`` UTF-8 bytes
(``truncated: true``). Citations are the distinct markers used, in first-use order, so there are
never more citations than packed evidence items (≤ 128).

Event order: ``answer.delta``… (with a ``heartbeat`` whenever the model has been silent for
``KNOWLEDGE_ANSWER_HEARTBEAT_SECONDS``, written as the SSE comment ``: heartbeat``) then exactly
one of ``answer.done`` (written to the trace first)
or ``answer.error`` (``answer_generation_failed``: the model call failed, ``cause`` is its code;
``answer_empty``: the model answered nothing citable). With no evidence, or evidence that is
about something else (``not-enough-evidence``), the answer is an explicit message, no model is
called, and ``answer.done`` has ``finish_reason: no-retrieval-evidence``. Marker-shaped text in
evidence is neutralised (:func:`retrieval.evidence.neutralise_markers`) before it is quoted or
given to a model, so only markers we emit are normalised.
"""

from .citations import CitationNormaliser  # noqa: F401
from .extractive import NO_SENTENCE_MESSAGE, answer_sentences, extract  # noqa: F401
from .generation import SYSTEM_PROMPT, prompt_messages  # noqa: F401
from .run import (  # noqa: F401
    FILTERS_MATCHED_NOTHING_MESSAGE,
    HEARTBEAT,
    NO_EVIDENCE_MESSAGE,
    PERMISSION_LIMITED_MESSAGE,
    SOURCES,
    UNRELATED_EVIDENCE_MESSAGE,
    GenerationFailed,
    answer,
    events,
    no_evidence_message,
    start,
)
from .state import AnswerRun, Generator, Requester  # noqa: F401
from .traces import get_trace, step  # noqa: F401
from .window import context_size  # noqa: F401
