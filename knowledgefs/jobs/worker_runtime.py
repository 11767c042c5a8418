"""How ``manage.py qcluster`` stops: within a grace period, with running work handed back.

Service managers stop a worker in one of two ways: SIGTERM to every process of it at once
(systemd's default ``KillMode=control-group``, ``kill -- -PGID``, Kubernetes and Docker with an
init that forwards to the group) or SIGTERM to its main process only (Docker without such an
init, ``scripts/serve.sh``). django-q2 1.11 alone survives neither:

* **Group SIGTERM hangs the main process forever.** Its sentinel restores the default action of
  SIGTERM, so it dies at once, usually while it sleeps in ``stop_event.wait()``; the main
  process's handler then calls ``stop_event.set()``, and multiprocessing's ``Condition.notify``
  waits for the dead sleeper to acknowledge its wake-up, which never comes. Workers die mid-task
  too, so their jobs' leases stay held until they expire.
* **Main-only SIGTERM waits for every running task to finish** (up to the task timeout, 30
  minutes by default) before the cluster stops; a container manager kills it long before.

:class:`Cluster` (used by our ``qcluster`` command) fixes both:

* its sentinel ignores SIGTERM (it is stopped through its stop event, by the main process) and,
  when stopping, first stops the pusher (no more broker reads: waits at most
  :data:`PUSHER_STOP_SECONDS`, then kills it) and only then sends SIGTERM to each worker;
* a worker's first SIGTERM raises :class:`WorkerShutdown` (a ``SystemExit``) in its main thread,
  once (later ones are ignored, so the hand-back itself is not interrupted): the task running
  unwinds, and compilation hands its held jobs back (``queued``, lease cleared, dispatched
  again) before the worker exits; an idle worker just exits. Before raising, the worker waits
  (at most :data:`HAND_BACK_WAIT_SECONDS`) until its sentinel has stopped the pusher: with a
  SIGTERM to the whole group the workers get it as early as the main process, and the
  stopping cluster's own pusher would otherwise take the message a job is handed back with
  (on the ORM broker that message then stays locked until the retry time, and the job waits
  for the recovery sweep instead of starting at once on another worker);
* the pusher and the monitor ignore SIGTERM and stop the normal way (the pusher stops taking
  messages, the monitor saves the results already produced);
* the main process sets the stop event from a helper thread and waits at most
  ``KNOWLEDGE_WORKER_SHUTDOWN_GRACE_SECONDS`` for the sentinel; whatever of the cluster is still
  alive then is SIGKILLed (leases it held expire and the recovery sweep takes the jobs).

A message a worker had taken but not finished is not acknowledged; on redelivery its claim no
longer matches the job (the hand-back cleared it), so it does nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from multiprocessing import Event
from multiprocessing.synchronize import Event as EventType
from typing import Any

from django.conf import settings
from django_q import cluster as q_cluster
from django_q.brokers import Broker
from django_q.conf import Conf
from django_q.signals import post_spawn

logger = logging.getLogger("knowledgefs.worker")


# How long a stopping sentinel waits for its pusher to stop taking messages before killing it,
# and how long a worker told to stop waits for that before it hands its jobs back anyway (a
# SIGTERM to one worker alone, a sentinel that died).
PUSHER_STOP_SECONDS = 5.0
HAND_BACK_WAIT_SECONDS = 10.0

# 1 once the sentinel's pusher has stopped: shared memory without a lock (a process that dies
# while reading it blocks nobody), made by the sentinel before it forks its workers.
_pusher_stopped: Any = None


class WorkerShutdown(SystemExit):
    """Raised in a worker's main thread by the first SIGTERM: stop the task, hand work back."""


def _on_worker_term(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: never interrupt the hand-back
    flag = _pusher_stopped
    if flag is not None:
        deadline = time.monotonic() + HAND_BACK_WAIT_SECONDS
        while not flag.value and time.monotonic() < deadline:
            time.sleep(0.05)
    raise WorkerShutdown(0)


def _install_worker_handler(sender: Any = None, **_: Any) -> None:
    """``post_spawn`` receiver, run in each new worker process (not the pusher or monitor)."""
    signal.signal(signal.SIGTERM, _on_worker_term)


def grace_seconds() -> float:
    """How long the main process waits for the cluster to stop before killing what is left."""
    return float(settings.KNOWLEDGE_WORKER_SHUTDOWN_GRACE_SECONDS)


class Sentinel(q_cluster.Sentinel):  # type: ignore[misc]  # django-q2: no type information
    """django-q2's sentinel, ignoring SIGTERM and telling its workers to stop first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["start"] = False
        super().__init__(*args, **kwargs)  # restores SIGTERM's default action
        # Stopped through the stop event only; the pusher and monitor inherit this.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        global _pusher_stopped
        _pusher_stopped = q_cluster.get_mp_context().RawValue("b", 0)  # inherited by the workers
        post_spawn.connect(_install_worker_handler, dispatch_uid="kfs-worker-sigterm")
        self.start()

    def stop(self) -> None:
        self.stop_pusher()
        for process in list(self.pool):
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        super().stop()  # the pusher is gone: its own wait for it returns at once

    def stop_pusher(self) -> None:
        """No more broker reads: stop the pusher (killed after :data:`PUSHER_STOP_SECONDS`),
        then let the workers hand their jobs back."""
        self.event_out.set()
        pusher = self.pusher
        deadline = time.monotonic() + PUSHER_STOP_SECONDS
        while pusher is not None and pusher.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if pusher is not None and pusher.is_alive():
            logger.warning("the pusher did not stop within %s s; killing it", PUSHER_STOP_SECONDS)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pusher.pid, signal.SIGKILL)
            pusher.join(5)
        if _pusher_stopped is not None:
            _pusher_stopped.value = 1


class Cluster(q_cluster.Cluster):  # type: ignore[misc]  # django-q2: no type information
    """django-q2's cluster with :class:`Sentinel` and a bounded, non-blocking stop."""

    def __init__(self, broker: Broker | None = None) -> None:
        super().__init__(broker)
        self._stopping = False

    def start(self) -> int:
        # django-q2's Cluster.start with our Sentinel (its own start names the class directly).
        if q_cluster.setproctitle:
            q_cluster.setproctitle.setproctitle(f"qcluster {q_cluster.current_process().name}")
        self.stop_event: EventType | None = Event()
        self.start_event: EventType | None = Event()
        self.sentinel = q_cluster.get_mp_context().Process(
            target=Sentinel,
            name=f"Process-{uuid.uuid4().hex}",
            args=(self.stop_event, self.start_event, self.cluster_id, self.broker, self.timeout),
        )
        self.sentinel.start()
        logger.info("Q Cluster %s starting.", self.name)
        while self.start_event and not self.start_event.is_set():
            if not self.sentinel.is_alive():
                if self.sentinel.exitcode == 0 or self._stopping:
                    break
                raise RuntimeError(
                    f"Q Cluster {self.name} failed to start: sentinel exited "
                    f"with code {self.sentinel.exitcode}"
                )
            time.sleep(0.1)
        return int(self.pid)

    def stop(self) -> bool:
        """Stop the sentinel within :func:`grace_seconds`; kill what is left after that."""
        self._stopping = True
        sentinel, stop_event = self.sentinel, self.stop_event
        if sentinel is None or not sentinel.is_alive():
            self.start_event = self.stop_event = None
            return False
        logger.info("Q Cluster %s stopping.", self.name)
        # Event.set() waits for every sleeper on the event to acknowledge; a sentinel that died
        # while waiting never does, so the set runs in a helper thread and the wait is bounded.
        if stop_event is not None:
            threading.Thread(target=stop_event.set, name="kfs-stop", daemon=True).start()
        sentinel.join(grace_seconds())
        if sentinel.is_alive():
            logger.warning("the cluster did not stop within %s s; killing it", grace_seconds())
            kill_tree(sentinel.pid)
            sentinel.join(5)
        self.start_event = self.stop_event = None
        logger.info("Q Cluster %s has stopped.", self.name)
        return True

    def sig_handler(self, signum: int, frame: Any) -> None:
        logger.info("qcluster got %s", Conf.SIGNAL_NAMES.get(signum, signum))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # one stop, however many signals follow
        self.stop()


def _children() -> dict[int, list[int]]:
    table: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            table.setdefault(int(fields[1]), []).append(int(entry))
    return table


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant of it (found through ``/proc``)."""
    table = _children()
    victims, todo = [], [pid]
    while todo:
        current = todo.pop()
        victims.append(current)
        todo.extend(table.get(current, []))
    for victim in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(victim, signal.SIGKILL)
