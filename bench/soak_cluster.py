"""One soak pass (bench/soak.py): a ``manage.py qcluster`` process group SIGKILLed and
restarted on a seeded schedule (or never, for the clean pass) while the driver sweeps with
``recover_jobs()``, polling job snapshots until every job is terminal or the caps pass."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from soak_checks import check, kfs_stats, last_stages, queued_waits, recovery, summary
from soak_documents import ROOT, TENANT, TERMINAL, admit

POLL_SECONDS = 0.25
SWEEP_SECONDS = 5.0


class Cluster:
    """``manage.py qcluster`` in its own process group; SIGKILL takes every process of it."""

    def __init__(self, env: dict, log: Path) -> None:
        self.env, self.log = env, log
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def note(self, text: str) -> None:
        with open(self.log, "a", encoding="utf-8") as handle:
            handle.write(f"=== soak driver {dt.datetime.now().isoformat()} {text}\n")

    def start(self) -> None:
        from django.db import connections

        connections.close_all()
        handle = open(self.log, "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=self.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle.close()
        self.starts += 1
        self.note(f"started cluster #{self.starts} pgid {self.process.pid}")

    def pids(self) -> set[int]:
        """Live processes of the cluster's process group."""
        if not self.process:
            return set()
        found = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                raw = (entry / "stat").read_bytes()
            except OSError:
                continue
            fields = raw[raw.rfind(b")") + 2 :].split()
            if int(fields[2]) == self.process.pid:  # field 5: process group
                found.add(int(entry.name))
        return found

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        # Reap nothing else: the group's other members were children of the sentinel and are
        # re-parented to init, which reaps them.

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        for pid in self.pids():  # stragglers of the group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def snapshot(space_id) -> dict:
    from ingestion.models import CompilationJob

    return {
        row[0]: {
            "document_id": row[1],
            "stage": row[2],
            "run_state": row[3],
            "attempts": row[4],
            "token": row[5],
            "worker": row[6],
            "error_code": row[7],
        }
        for row in CompilationJob.objects.filter(space_id=space_id).values_list(
            "id",
            "document_id",
            "stage",
            "run_state",
            "execution_attempts",
            "lease_token",
            "worker_id",
            "error_code",
        )
    }


def run_pass(
    name: str,
    items,
    *,
    env: dict,
    var_dir: Path,
    kill: bool,
    seed: int,
    cap_minutes: float,
    settle_minutes: float,
    stamp: str,
) -> dict:
    from ingestion.compilation.recovery import recover_jobs
    from spaces import services as spaces

    principal = spaces.Principal(tenant_id=TENANT)
    space = spaces.create_space(principal, name=f"soak {name} {stamp}", slug=f"{name}-{stamp}")
    started = time.monotonic()
    admitted, rejected = admit(space, items)
    admission_seconds = time.monotonic() - started
    print(
        f"[{name}] admitted {len(admitted)}, rejected {len(rejected)} in {admission_seconds:.1f} s",
        flush=True,
    )

    log = var_dir / f"soak-qcluster-{name}-{stamp}.log"
    cluster = Cluster(env, log)
    rng = random.Random(seed)
    kills: list[dict] = []
    sweeps: list[dict] = []
    # Per job: observed transitions (time since start, what changed).
    history: dict = {}
    last: dict = {}
    t0 = time.monotonic()
    cluster.start()
    next_kill = t0 + rng.uniform(3, 8) if kill else None
    next_sweep = t0 + SWEEP_SECONDS
    next_report = t0 + 10
    killing_until = t0 + cap_minutes * 60
    settle_until = killing_until + settle_minutes * 60
    all_terminal_at = None
    killing_stopped_at = None
    try:
        while True:
            now = time.monotonic()
            rows = snapshot(space.id)
            for job_id, row in rows.items():
                before = last.get(job_id)
                if before is None or (
                    before["stage"],
                    before["run_state"],
                    before["token"],
                ) != (row["stage"], row["run_state"], row["token"]):
                    history.setdefault(job_id, []).append(
                        {
                            "t": round(now - t0, 3),
                            "stage": row["stage"],
                            "run_state": row["run_state"],
                            "attempts": row["attempts"],
                            "token": str(row["token"]) if row["token"] else None,
                            "worker": row["worker"],
                        }
                    )
                last[job_id] = row
            live = [j for j, r in rows.items() if r["run_state"] not in TERMINAL]
            if not live:
                all_terminal_at = now
                break
            if next_kill is not None and now >= killing_until:
                next_kill = None
                killing_stopped_at = now
                cluster.note("kill cap reached; no more kills")
                print(f"[{name}] kill cap reached with {len(live)} live jobs", flush=True)
            if next_kill is None and now >= settle_until:
                break
            if next_kill is not None and now >= next_kill:
                pids = cluster.pids()
                interval = now - (kills[-1]["t"] + t0 if kills else t0)
                cluster.kill()
                killed_at = time.monotonic()
                after = snapshot(space.id)
                held = {
                    str(j): r["stage"]
                    for j, r in after.items()
                    if r["run_state"] == "running"
                    and r["worker"]
                    and int(r["worker"].rsplit(":", 1)[1]) in pids
                }
                stale = sum(
                    1
                    for j, r in after.items()
                    if r["run_state"] == "running" and str(j) not in held
                )
                kills.append(
                    {
                        "n": len(kills) + 1,
                        "t": round(killed_at - t0, 3),
                        "since_previous": round(interval, 3),
                        "cluster_pids": sorted(pids),
                        "held_jobs": held,
                        "running_from_earlier_kills": stale,
                        "states": dict(Counter(r["run_state"] for r in after.values())),
                    }
                )
                cluster.note(f"KILL #{len(kills)} pids {sorted(pids)} held {len(held)} jobs")
                cluster.start()
                next_kill = time.monotonic() + rng.uniform(3, 8)
            if now >= next_sweep:
                s = time.monotonic()
                report = recover_jobs().as_dict()
                if any(report.values()):
                    sweeps.append({"t": round(s - t0, 3), **report})
                next_sweep = s + SWEEP_SECONDS
            if now >= next_report:
                states = Counter(r["run_state"] for r in rows.values())
                stages = Counter(r["stage"] for r in rows.values() if r["run_state"] == "running")
                print(
                    f"[{name}] t={now - t0:6.1f}s kills={len(kills)} {dict(states)} "
                    f"running stages {dict(stages)}",
                    flush=True,
                )
                next_report = now + 10
            time.sleep(POLL_SECONDS)
    finally:
        ended = time.monotonic()
        cluster.stop()
        cluster.note("stopped")
    wall = (all_terminal_at or ended) - t0
    result = {
        "space": {"slug": space.slug, "id": str(space.id), "tenant": TENANT},
        "admission_seconds": round(admission_seconds, 2),
        "wall_seconds_cluster_start_to_all_terminal": round(wall, 2) if all_terminal_at else None,
        "ended_without_all_terminal_after_seconds": None if all_terminal_at else round(wall, 2),
        "killing_stopped_by_cap_at_seconds": round(killing_stopped_at - t0, 2)
        if killing_stopped_at
        else None,
        "cluster_starts": cluster.starts,
        "kills": len(kills),
        "kill_intervals_seconds": summary([k["since_previous"] for k in kills]),
        "recovery_sweeps_with_work": sweeps,
        "qcluster_log": str(log),
        "rejected_at_admission": rejected,
    }
    result.update(check(space, admitted))
    result["failed_jobs_last_stage_before_failure"] = last_stages(history, "failed")
    result["held_at_kills_per_job"] = dict(
        sorted(Counter(Counter(j for k in kills for j in k["held_jobs"]).values()).items())
    )
    result["recovery"] = recovery(kills, history)
    result["longest_wait_in_queued_per_job_seconds"] = queued_waits(history, ended - t0)
    result["kill_log"] = kills
    result["stats_command"] = kfs_stats(space.slug, env)
    print(f"[{name}] {json.dumps({k: v for k, v in result.items() if k != 'kill_log'})[:3000]}")
    return result
