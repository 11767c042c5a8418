"""Durable document compilation: parse → chunk → embed → index → publish.

The database is the source of truth; the task queue only delivers ids.

* **Dispatch without a gap.** :func:`dispatch` first claims a ``queued`` attempt that has no
  task id by writing a fresh delivery id (``task_id``) in its own committed transaction, then
  enqueues ``(job id, delivery id)``; if enqueueing fails the claim is released, but only if it
  still holds our delivery id. Nothing is enqueued without a claim.
* **Fenced execution.** A delivery starts only by a compare-and-set from ``queued`` with its own
  delivery id, which issues a fresh ``lease_token``; every later write (checkpoint, progress,
  failure, success) is conditioned on that token, so a stale worker, a duplicate delivery or a
  late message changes nothing. A lease keeper thread extends the lease while the worker lives.
* **Checkpoints.** Each stage commits its output together with its checkpoint, so a resumed
  attempt finds all of a stage's output or none of it and continues from the last checkpoint
  without duplicating nodes or projections (node ids are UUIDv5 of the generation and chunk).
* **Recovery.** :func:`recover_jobs` (a django-q2 schedule) re-dispatches attempts claimed but
  never delivered, attempts whose lease expired (a killed worker) and retries that are due,
  through the same claim path; it fails an attempt whose task django-q2 recorded as timed out.
* **Retry and cancel.** Failures carry a stable ``error_code`` and are retryable (back off, then
  ``failed`` after ``KNOWLEDGE_JOB_MAX_ATTEMPTS``) or terminal. Cancel is cooperative: the
  worker checks its lease between stages and after every embedding batch, and a canceled
  attempt writes nothing after the cancel commits.
* **Bounded memory.** Parsing runs under the machine-wide materialization gate; a parsed
  artifact is retained only under a retained-artifact lease (count and byte budget), so a
  claimed batch is compiled in waves that fit (see :mod:`ingestion.memory_gates`).

Several queued jobs of one space can be compiled as one batch so that their chunks share
embedding batches; a failure in one document fails only that document.

Modules, in dependency order: :mod:`.progress` (checkpoint percents), :mod:`.errors` (failure
and lease-lost exceptions, ``classify``), :mod:`.leases` (claims, leases, fenced checkpoints),
:mod:`.dispatch` (claim then enqueue, the sweep's schedule), :mod:`.assets` (parse images),
:mod:`.generations` (nodes of a job, removing generations), :mod:`.failures` (ending an
attempt), :mod:`.parse_step`, :mod:`.publish`, :mod:`.operations` (cancel, retry, supersede),
:mod:`.stage_commit` (a stage's outputs with their checkpoints), :mod:`.waves` (admission under
the gates), :mod:`.embed_step`, :mod:`.pipeline` (a delivery's batch, stage by stage) and
:mod:`.recovery` (the sweep and the in-process drain).
"""
