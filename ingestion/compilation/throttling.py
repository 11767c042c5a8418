"""Embedding against a rate-limited provider: a machine-wide bound per provider, and throttling
shown on the jobs.

**Concurrency per provider.** Every embedding call to a remote model (one with a ``provider``:
the Dify models) holds a slot of a :class:`~ingestion.memory_gates.MachineSemaphore` named after
the tenant and provider, capacity ``KNOWLEDGE_EMBEDDING_PROVIDER_CONCURRENCY`` (default 2), so
all the worker processes of a machine together never have more calls in flight to one
provider's credentials (a call of at most 16 texts is one request; the compiler's batches are
8). The local model has no provider and no slot.

**Throttling.** The Dify transport retries a 429 after ``Retry-After`` (jittered, bounded by the
call's deadline, :mod:`knowledgefs.dify.transport`); :class:`ThrottleWatch` is told of each wait
and writes it into the jobs' progress at once (``phase`` stays ``embedding``, the operation
says "throttled by the provider", ``throttled`` counts the waits), so a throttled job shows
throttling, not failure.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.conf import settings

from ingestion import memory_gates as gates
from ingestion.compilation.leases import Held


def provider_gate(model) -> gates.MachineSemaphore | None:
    """The machine-wide gate of ``model``'s provider, or ``None`` for a local model."""
    provider = getattr(model, "provider", None)
    if not provider:
        return None
    tenant = getattr(model, "tenant_id", "")
    digest = hashlib.sha256(f"{tenant}\0{provider}".encode()).hexdigest()[:24]
    return gates.MachineSemaphore(
        f"embedding-provider-{digest}", int(settings.KNOWLEDGE_EMBEDDING_PROVIDER_CONCURRENCY)
    )


@contextmanager
def provider_slot(gate: gates.MachineSemaphore | None) -> Iterator[None]:
    """Hold one slot of ``gate`` (nothing for ``None``) around one embedding call."""
    if gate is None:
        yield
        return
    lease = gate.acquire()
    try:
        yield
    finally:
        if lease is not None:
            lease.release()


class ThrottleWatch:
    """Counts the provider's throttled waits during one embedding stream and shows them.

    A :func:`knowledgefs.dify.transport.throttle_listener` callback. ``progress(note)`` builds
    the progress of the jobs being embedded; on the compiling thread it is written at once
    (``held.beat``, which also renews the leases), from a client's pool thread it waits for the
    next regular write.
    """

    def __init__(self, held: Held, model_id: str) -> None:
        self.held = held
        self.model_id = model_id
        self.count = 0
        self.waited = 0.0
        self.progress: Callable[[str], dict] | None = None
        self._thread = threading.get_ident()
        self._lock = threading.Lock()

    def note(self) -> str:
        if not self.count:
            return f"embedding with {self.model_id}"
        return (
            f"embedding with {self.model_id}: throttled by the provider "
            f"({self.count} waits, {self.waited:.1f} s), retrying"
        )

    def __call__(self, route: str, status: int | None, seconds: float) -> None:
        with self._lock:
            self.count += 1
            self.waited += seconds
        if self.progress is not None and threading.get_ident() == self._thread:
            self.held.beat(self.progress(self.note()))
