"""Durable research tasks: Research mode run on the worker queue, with a plan estimate, partial
evidence, cancel and resume (docs/retrieval.md, "Research tasks").

* :mod:`.models` — :class:`ResearchTask` and :class:`ResearchTaskPartial`.
* :mod:`.planning` — the dry-run estimate (model calls, tokens, latency, steps, work bounds) and
  the check of a task's limits against it.
* :mod:`.service` — create (idempotent), read, list, partials, cancel, resume.
* :mod:`.dispatch` — the claim before enqueue, the compare-and-set start, fenced writes and the
  recovery sweep (the shapes of :mod:`upgrades.services.dispatch`).
* :mod:`.runner` — one delivery: :func:`retrieval.research.run_research` with ``durable=True``.
* :mod:`.tasks` — the django-q2 entry points; :mod:`.api` — the REST views; :mod:`.admin`.
"""
