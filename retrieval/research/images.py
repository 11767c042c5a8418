"""Query images in Research (interactive and durable): at most one image-to-text expansion.

Research has no visual leg: the images reach it through one expansion by the space's reasoning
model when that model accepts images (:func:`retrieval.query_images.expand`, strict JSON
``{description, ocrText, keywords}``, bounded by ``KNOWLEDGE_QUERY_IMAGE_EXPANSION_TIMEOUT_MS``
and by what is left of the run's wall clock). The derived text is searched with the question
(or as the question when the request holds only images) and handed to the planner with it.

The expansion is a model call of the run: it counts against the model-call budget (a run with
images has one more call allowed, :data:`EXPANSION_CALLS`) and its outcome is kept in the
checkpoint under :data:`STEP` (``{"status": "ok", "output": {"text"}, "images"}`` or
``{"status": "failed", "error": <degradation>, "images"}``), so a resumed durable task neither
fetches the images nor calls the model again. Degradations (``metrics.degradations``):

- ``query-image-ignored-no-vision-model``: the reasoning model does not accept images (or there
  is none) and the request has text; the images are not read. An image-only request is 400
  ``query_image_requires_vision`` instead;
- ``query-image-visual-leg-unavailable``: Dify could not deliver the images in time;
- ``query-image-expansion-timeout``: the call ran past its deadline, failed, or the budget left
  no room for it (``budget_exhausted`` then says which).
"""

from __future__ import annotations

import logging
import time

from django.conf import settings

from knowledgefs.errors import InvalidInput

from ..query_images import (
    EXPANSION_TIMEOUT,
    IGNORED_NO_VISION_MODEL,
    VISUAL_LEG_UNAVAILABLE,
    ImagePlan,
    QueryImage,
)
from .budget import MIN_CALL_SECONDS, _Run

logger = logging.getLogger("knowledgefs.retrieval")

STEP = "image_expansion"
#: Model calls a run with query images may make beyond its policy's: the one expansion.
EXPANSION_CALLS = 1


def require_usable(profile, query: str, references: list[str]) -> None:
    """400 ``query_image_requires_vision`` for an image-only Research request on a space whose
    reasoning model does not accept images (Research has no visual leg)."""
    from spaces.capabilities import space_modalities

    if not references or query:
        return
    reasoning = space_modalities(profile)["reasoning"]
    if not reasoning.image:
        raise InvalidInput(
            "an image-only Research query needs a reasoning model that accepts images: "
            f"this space's does not ({reasoning.reason}); Research reads images only through "
            "one description by that model. Add text to the query, or ask Fast with an "
            "image-capable embedding profile",
            code="query_image_requires_vision",
            details={"field": "query_images", "reasoning": reasoning.as_dict()},
        )


def expand_images(run: _Run, query: str, references: list[str], subject: str) -> ImagePlan:
    """The images' part of this run (module docstring); never raises for a model or Dify
    failure (a degradation), only for bad input (the 4xx of :func:`load_images`)."""
    from spaces.capabilities import space_modalities

    plan = ImagePlan()
    if not references:
        return plan
    saved = run.checkpoint.get(STEP)
    if isinstance(saved, dict) and saved.get("status") in ("ok", "failed"):
        run.calls += 1
        run.calls_reused += 1
        plan.images = [_record(r) for r in saved.get("images") or [] if isinstance(r, dict)]
        output = saved.get("output")
        output = output if isinstance(output, dict) else {}
        if saved["status"] == "ok" and isinstance(output.get("text"), str):
            plan.expanded_query = output["text"]
        else:
            plan.degradations.append(EXPANSION_TIMEOUT)
        return plan
    require_usable(run.profile, query, references)
    if not space_modalities(run.profile)["reasoning"].image:
        plan.degradations.append(IGNORED_NO_VISION_MODEL)  # the bytes are never loaded
        return plan
    from ..query_images import _Unavailable, load_images

    try:
        plan.images = load_images(run.space, references, subject=subject)
    except _Unavailable:
        plan.degradations.append(VISUAL_LEG_UNAVAILABLE)
        return plan
    run.poll()
    if run.calls >= run.max_calls:
        run.budget_exhausted = run.budget_exhausted or "model_calls"
        plan.degradations.append(EXPANSION_TIMEOUT)
        return plan
    left = run.remaining()
    if left < MIN_CALL_SECONDS:
        run.budget_exhausted = run.budget_exhausted or "wall_clock"
        plan.degradations.append(EXPANSION_TIMEOUT)
        return plan
    run.calls += 1
    run.persist()  # the call counts once started
    t0 = time.perf_counter()
    records = [i.as_dict() for i in plan.images]
    timeout_ms = min(settings.KNOWLEDGE_QUERY_IMAGE_EXPANSION_TIMEOUT_MS, int(left * 1000))
    try:
        plan.expanded_query = _expand(run, plan.images, timeout_ms)
        outcome = {"status": "ok", "output": {"text": plan.expanded_query}, "images": records}
    except Exception as exc:  # noqa: BLE001 - a slow or failing model degrades, never a 500
        logger.warning("space %s: query-image expansion failed: %s", run.space.pk, exc)
        plan.degradations.append(EXPANSION_TIMEOUT)
        outcome = {"status": "failed", "error": EXPANSION_TIMEOUT, "images": records}
    run.timings["image_expansion_ms"] = (time.perf_counter() - t0) * 1000
    run.checkpoint[STEP] = outcome
    run.persist()
    run.poll()
    return plan


def _expand(run: _Run, images: list[QueryImage], timeout_ms: int) -> str:
    from ..query_images import expand

    return expand(run.space, run.profile, images, timeout_ms=timeout_ms)


def _record(value: dict) -> QueryImage:
    """A checkpointed image record (no bytes: a resumed run does not read the images again)."""
    return QueryImage(
        str(value.get("upload_file_id") or ""),
        str(value.get("sha256") or ""),
        int(value.get("byte_size") or 0),
        str(value.get("mime_type") or ""),
    )
