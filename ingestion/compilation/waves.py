"""Admitting a wave: the jobs whose artifacts are parsed or loaded and held in memory together.

Parsing runs under the machine-wide materialization gate; a parsed artifact is retained only
under a retained-artifact lease (count and byte budget, :mod:`ingestion.memory_gates`), handed over
from the materialization slot so the artifact is always covered. Only the first job of a wave
may wait on a gate.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from django.db.models import Count, Sum
from django.db.models.functions import Length

from ingestion import memory_gates as gates
from ingestion.compilation.assets import delete_assets
from ingestion.compilation.errors import CompilationFailure, classify
from ingestion.compilation.failures import end_attempt
from ingestion.compilation.leases import Held
from ingestion.compilation.parse_step import _parse
from ingestion.compilation.progress import PROGRESS, _progress
from ingestion.compilation.stage_commit import _commit
from ingestion.models import CompilationJob, KnowledgeNode, ParseArtifact, Stage
from ingestion.parsing.isolation import ParseCanceled
from ingestion.revisions import Source

logger = logging.getLogger("knowledgefs.compilation")


@dataclass
class _Work:
    """One held job inside a wave: what it has in memory and its retained-artifact lease."""

    job: CompilationJob
    artifact: ParseArtifact | None = None
    lease: gates.Lease | None = None


def _admit_wave(
    held: Held,
    jobs: dict[uuid.UUID, CompilationJob],
    pending: list[uuid.UUID],
    wave: dict[uuid.UUID, _Work],
) -> list[uuid.UUID]:
    """Fill ``wave`` with jobs admitted under retained-artifact leases; returns the rest.

    The first job of a wave holds nothing while it waits, so it may wait for the
    materialization gate and then for its lease (an artifact over the whole budget runs
    alone). A later job never waits on either gate while the wave holds leases (two workers
    could otherwise each hold what the other waits for): if a gate is not free at once, the
    wave closes. A resumed job's lease is taken before its artifact is loaded; a freshly parsed
    artifact that finds no lease is committed with its ``parsed`` checkpoint at once and dropped
    from memory. Light documents of the wave are parsed one after another under one shared
    materialization slot (:class:`_LightSlot`), given back once the wave's artifacts are all
    retained. The caller releases the leases of ``wave``, however this returns.
    """
    gate = gates.retained_artifact_gate()
    parsed: dict[uuid.UUID, ParseArtifact] = {}
    rest = list(pending)
    light = _LightSlot()
    try:
        while rest:
            if len(wave) >= gate.capacity:
                # Every wave member holds a lease, so the gate's count bound admits no more:
                # close the wave now rather than parse a document that would find no room.
                break
            job_id = rest[0]
            if held.is_lost(job_id):
                rest.pop(0)
                held.release(job_id)
                continue
            job, first = jobs[job_id], not wave
            work = _Work(job)
            try:
                if job.stage == Stage.QUEUED:
                    outcome, work.artifact, work.lease = _materialize(
                        held, job, gate, light, first=first
                    )
                    if outcome == "lost":
                        rest.pop(0)
                        held.release(job_id)
                        continue
                    if outcome == "busy":
                        break
                    if work.lease is None:  # parsed, but no room left in this wave
                        light.release()
                        held.active.discard(job_id)
                        if _commit(
                            held,
                            {job_id: work.artifact},
                            Stage.PARSED,
                            _save_artifacts,
                            progress=_parsed_progress,
                        ):
                            job.stage = Stage.PARSED  # reloaded in a later wave
                        else:  # not ours any more: its stored images go with it
                            delete_assets(work.artifact.assets)
                        break
                    parsed[job_id] = work.artifact
                else:
                    work.lease = _retain(held, job_id, gate, _resume_charge(job, gate), first)
                    if work.lease is None:
                        if held.is_lost(job_id, max_age=0):  # canceled: never starts work
                            rest.pop(0)
                            held.release(job_id)
                            continue
                        break
                    if not held.start(job_id):  # canceled or taken over: never starts work
                        work.lease.release()
                        rest.pop(0)
                        held.release(job_id)
                        continue
                    if job.stage == Stage.PARSED:
                        work.artifact = ParseArtifact.objects.filter(job_id=job_id).first()
                        if work.artifact is None:
                            raise CompilationFailure(
                                "artifact_missing",
                                "the parse checkpoint has no artifact",
                                retryable=True,
                            )
            except Exception as exc:  # noqa: BLE001 - any error ends only this job
                if work.lease is not None:
                    work.lease.release()
                held.start(job_id)  # a failure counts as an attempt, so retries stay bounded
                if not isinstance(exc, CompilationFailure):
                    logger.exception("compilation of job %s failed", job_id)
                end_attempt(job_id, held.tokens[job_id], classify(exc))
                held.release(job_id)
                rest.pop(0)
                continue
            rest.pop(0)
            wave[job_id] = work
    finally:
        light.release()  # every artifact parsed under it is retained (or committed) by now
        committed = _commit(held, parsed, Stage.PARSED, _save_artifacts, progress=_parsed_progress)
        for job_id in [j for j in parsed if j not in committed]:
            delete_assets(parsed[job_id].assets)  # never checkpointed: nothing half-written stays
    for job_id in [j for j in parsed if j not in committed and j in wave]:
        lease = wave.pop(job_id).lease
        if lease is not None:  # (every wave member holds one)
            lease.release()
    return rest


def _save_artifacts(artifacts: list[ParseArtifact]) -> None:
    ParseArtifact.objects.bulk_create(artifacts)


def _parsed_progress(artifact: ParseArtifact) -> dict:
    return _progress(
        "parsed", "parsed", PROGRESS[Stage.PARSED], elements_parsed=len(artifact.elements)
    )


class _LightSlot:
    """One main-lane materialization slot shared by the light documents of a wave.

    The materialization gate bounds how many sources are read and parsed at once; a wave parses
    its documents one after another on one thread, so one slot held across its light documents
    keeps that bound while costing two ledger transactions per wave instead of two per document
    (:func:`ingestion.memory_gates.materialization_gate`). Heavy documents still take their own
    lanes per document, heavy lane first; the shared slot is given back before they do, so the fixed
    lock order (heavy, then main) holds. The slot is given back once the wave's artifacts are
    retained (the hand-off rule), or as soon as the wave closes.
    """

    def __init__(self) -> None:
        self.lease: gates.Lease | None = None

    def acquire(self, should_abort, *, block: bool) -> bool:
        """Hold the slot (already held: at once); ``False`` if not free and not ``block``.

        Raises :class:`ingestion.memory_gates.GateAborted` when ``should_abort()`` is true while
        waiting.
        """
        if self.lease is None:
            self.lease = gates.materialization_gate().acquire(
                block=block, should_abort=should_abort
            )
        return self.lease is not None

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None


def _materialize(held: Held, job: CompilationJob, gate, light: _LightSlot, *, first: bool):
    """Parse under the materialization gate, then take a retained lease before letting go.

    A light document parses under the wave's shared slot ``light`` (taken now if the wave does
    not hold it yet); a heavy one takes its own heavy and main lanes for its parse. Returns
    ``(outcome, artifact, lease)``: ``("lost", None, None)`` when the job was canceled or taken
    over before it started, ``("busy", None, None)`` when ``first`` is false and a
    materialization lane is not free at once, else ``("parsed", artifact, lease)`` where
    ``lease`` is ``None`` if ``first`` is false and the retained gate had no room.
    """
    source = Source(job)  # the candidate revision's type and size, not the published document's
    aborted = lambda: held.is_lost(job.id)  # noqa: E731
    try:
        if gates.is_heavy(source.mime_type, source.size_bytes):
            light.release()
            with gates.materialization_slot(True, should_abort=aborted, block=first) as slot:
                if slot is None:
                    return "busy", None, None
                return _parse_and_retain(held, job, gate, first=first)
        if not light.acquire(aborted, block=first):
            return "busy", None, None
        return _parse_and_retain(held, job, gate, first=first)
    except (gates.GateAborted, ParseCanceled):  # canceled while waiting or while parsing
        return "lost", None, None


def _parse_and_retain(held: Held, job: CompilationJob, gate, *, first: bool):
    """Inside a materialization slot: start the job (its lease check), parse, retain.

    Hand-off: the caller's slot is let go only after this returns, so the artifact is covered
    by the slot until its retained lease is held.
    """
    if not held.start(job.id, _progress("parsing", "reading and parsing the source", 5)):
        return "lost", None, None
    artifact = _parse(job, held)
    try:
        return "parsed", artifact, _retain(held, job.id, gate, artifact.retained_bytes, first)
    except BaseException:
        delete_assets(artifact.assets)  # the artifact is never checkpointed
        raise


def _retain(held: Held, job_id: uuid.UUID, gate, charge: int, block: bool):
    """A retained-artifact lease, or ``None`` (gate full and not blocking, or job lost)."""
    try:
        return gate.acquire(charge, block=block, should_abort=lambda: held.is_lost(job_id))
    except gates.GateAborted:
        return None


def _resume_charge(job: CompilationJob, gate) -> int:
    """The retained-byte charge of a job resuming after ``parsed``, read without loading it."""
    if job.stage == Stage.PARSED:
        charge = (
            ParseArtifact.objects.filter(job_id=job.id)
            .values_list("retained_bytes", flat=True)
            .first()
        )
        return charge or gate.byte_budget  # unknown size: run alone
    return _node_charge(job)


def _node_charge(job: CompilationJob) -> int:
    """A conservative retained-byte charge for a job resuming after chunking (its node texts)."""
    if job.document_id is None:  # its document was deleted: no nodes
        return 0
    agg = KnowledgeNode.objects.filter(document_id=job.document_id, generation=job.id).aggregate(
        chars=Sum(Length("text")), n=Count("id")
    )
    return 2 * (agg["chars"] or 0) + 512 * (agg["n"] or 0)
