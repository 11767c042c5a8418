"""The quality loop (docs/quality.md): what the answers got wrong, seen, sorted and kept.

* :mod:`.models` — :class:`FailedQuery`, :class:`BadCase` and its immutable history.
* :mod:`.scope` — who may read a row: its exact requester provenance and permission scope.
* :mod:`.capture` — failed-query capture after an answer trace commits (not-enough-evidence,
  low confidence), off the answer's hot path; best-effort, never logs query text.
* :mod:`.feedback` — ``POST /v1/queries/{trace_id}/feedback`` and the failed-query reads.
* :mod:`.bad_cases` — bad cases from a trace: statuses, compare-and-set, history.
* :mod:`.triage`, :mod:`.triage_judge`, :mod:`.triage_runs` — triage by independent signals
  (keywords, titles, the space's reasoning model), as durable runs with list, cancel and retry.
* :mod:`.replay`, :mod:`.frozen`, :mod:`.replay_runner` — replay runs on a frozen snapshot
  (index version, profile, the publication's documents).
"""
