"""A Research run's budget and state: the :class:`Policy` (model calls, wall clock, judge,
supplements), the checkpoint members, and :class:`_Run`, which charges earlier deliveries,
runs or reuses each model call and records stages."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import reasoning

if TYPE_CHECKING:
    from spaces.models import KnowledgeSpace

STEPS = ("image_expansion", "planner", "judge", "supplemental")
ROUNDS_KEY = "rounds"
"""Checkpoint member: the evidence of each finished retrieval round, ``[{items, metrics}]``."""
SPENT_KEY = "spent"
"""Checkpoint member: ``{"model_calls", "elapsed_ms"}`` spent by all deliveries so far."""
MIN_CALL_SECONDS = 1.0


class ResearchCanceled(Exception):
    """Raised when ``should_stop()`` answered ``True`` (between steps, or during a model call)."""


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class Policy:
    """A run's budget (reference inventory §5.3, Research Evidence V3 policies)."""

    name: str
    max_model_calls: int
    wall_clock_seconds: float
    max_supplements: int
    judge: bool


INTERACTIVE = Policy("interactive", 3, 60.0, 0, False)
DURABLE = Policy("durable", 3, 180.0, 1, True)


@dataclass
class _Run:
    space: KnowledgeSpace
    profile: object
    policy: Policy
    checkpoint: dict
    save: Callable[[dict], None] | None
    should_stop: Callable[[], bool] | None
    deadline_s: float | None = None
    max_calls: int = 0
    started: float = field(default_factory=time.monotonic)
    prior_elapsed: float = 0.0
    prior_calls: int = 0
    calls: int = 0
    calls_reused: int = 0
    calls_abandoned: int = 0
    budget_exhausted: str | None = None
    degraded: bool = False
    degradation_reason: str | None = None
    stages: list[dict] = field(default_factory=list)
    timings: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Charge what earlier deliveries spent (the checkpoint's ``spent``): their wall clock,
        and the model calls they started that left no outcome (cut short by a cancel)."""
        spent = self.checkpoint.get(SPENT_KEY)
        spent = spent if isinstance(spent, dict) else {}
        self.prior_elapsed = max(0, _int(spent.get("elapsed_ms"))) / 1000
        self.prior_calls = max(0, _int(spent.get("model_calls")))
        recorded = sum(
            1
            for step in STEPS
            if isinstance(self.checkpoint.get(step), dict)
            and self.checkpoint[step].get("status") in ("ok", "failed")
        )
        self.calls_abandoned = max(0, self.prior_calls - recorded)
        self.calls = self.calls_abandoned

    def elapsed(self) -> float:
        """Seconds of this run (this delivery)."""
        return time.monotonic() - self.started

    def remaining(self) -> float:
        """Seconds left: the policy's wall clock less earlier deliveries' and this run's time,
        and never past the caller's ``deadline_s``."""
        elapsed = self.elapsed()
        left = self.policy.wall_clock_seconds - self.prior_elapsed - elapsed
        if self.deadline_s is not None:
            left = min(left, self.deadline_s - elapsed)
        return left

    def persist(self) -> None:
        """Hand the checkpoint, with ``spent`` brought up to date, to ``save_checkpoint``."""
        if self.save is None:
            return
        self.checkpoint[SPENT_KEY] = {
            "model_calls": max(self.prior_calls, self.calls),
            "elapsed_ms": round((self.prior_elapsed + self.elapsed()) * 1000),
        }
        self.save(self.checkpoint)

    def poll(self) -> None:
        if self.should_stop is not None and self.should_stop():
            raise ResearchCanceled("the research run was canceled")

    def stage(self, name: str, status: str, count: int, started: float, filtered: int = 0):
        self.stages.append(
            {
                "name": name,
                "status": status,
                "candidate_count": count,
                "filtered_count": filtered,
                "duration_ms": round((time.perf_counter() - started) * 1000, 2),
            }
        )

    def call(self, step: str, selection, prompt: reasoning.Prompt) -> dict | None:
        """Run one model step (or reuse its checkpointed outcome); ``None`` when it failed or
        the budget does not allow it (recorded)."""
        saved = self.checkpoint.get(step)
        if isinstance(saved, dict) and saved.get("status") in ("ok", "failed"):
            self.calls += 1
            self.calls_reused += 1
            if saved["status"] == "ok":
                try:  # checked again: a stored checkpoint is data like any other
                    return prompt.schema.parse(json.dumps(saved.get("output")))
                except reasoning.ReasoningInvalidOutput:
                    saved = {"status": "failed", "error": reasoning.ReasoningInvalidOutput.code}
            self._degrade(str(saved.get("error") or "reasoning_error")[:64])
            return None
        if self.calls >= self.max_calls:
            self.budget_exhausted = self.budget_exhausted or "model_calls"
            return None
        left = self.remaining()
        if left < MIN_CALL_SECONDS:
            self.budget_exhausted = self.budget_exhausted or "wall_clock"
            return None
        self.calls += 1
        self.persist()  # the call counts once started: a cancel mid-call does not refund it
        try:
            answer = reasoning.ask(
                self.space,
                selection,
                prompt,
                timeout_ms=int(left * 1000),
                should_stop=self.should_stop,
            )
            outcome: dict[str, Any] = {"status": "ok", "output": answer.output}
        except reasoning.ReasoningCanceled:
            raise ResearchCanceled("the research run was canceled during a model call") from None
        except reasoning.ReasoningError as exc:
            outcome = {"status": "failed", "error": exc.code}
            if self.remaining() < MIN_CALL_SECONDS:
                self.budget_exhausted = self.budget_exhausted or "wall_clock"
        self.checkpoint[step] = outcome
        self.persist()
        if outcome["status"] == "failed":
            self._degrade(outcome["error"])
            return None
        return outcome["output"]

    def _degrade(self, reason: str) -> None:
        if not self.degraded:
            self.degraded = True
            self.degradation_reason = reason
