"""Quality trends of a space (``…/quality/trends``, the admin's quality page).

``window`` ``24h | 7d | 30d`` (default ``7d``) ending now (or at ``to``); the baseline is the
window before it. Per window: the replay pass rate (items passed / items finished, over the
runs that finished in it), failed queries captured, replay runs; the current window adds bad
cases by status. ``slices`` group the current window's runs by mode, embedding model and
retrieval-profile revision; ``top_unanswered`` are the largest paraphrase clusters of the
window's ``not-enough-evidence`` failed queries. ``daily`` (for the charts) has one entry per
day of the window: ``{day, pass_rate, failed_queries{verdict: n}}``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import date, datetime, timedelta
from typing import TypedDict

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from knowledgefs.errors import InvalidInput

from .models import BadCase, FailedQuery, ReplayRun
from .scope import readable
from .triage import cluster_key

WINDOWS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}


class _Day(TypedDict):
    """One day of :func:`_daily`: the replay runs finished on it and its failed queries."""

    runs: list[ReplayRun]
    failed: Counter[str]


def _window(params) -> tuple[str, timedelta, datetime]:
    name = params.get("window") or "7d"
    if name not in WINDOWS:
        raise InvalidInput("window must be 24h, 7d or 30d", code="invalid_window",
                           details={"field": "window"})  # fmt: skip
    end = timezone.now()
    if params.get("to"):
        to = parse_datetime(params["to"])
        if to is None:
            raise InvalidInput("to must be an ISO 8601 time", code="invalid_time",
                               details={"field": "to"})  # fmt: skip
        end = to
    return name, WINDOWS[name], end


def _pass_rate(runs) -> float | None:
    passed = sum((r.summary or {}).get("passed", 0) for r in runs)
    done = sum((r.summary or {}).get("completed", 0) for r in runs)
    return round(passed / done, 4) if done else None


def _period(principal, space, start, end) -> dict:
    runs = list(
        readable(principal, ReplayRun.objects.all(), space).filter(
            completed_at__gte=start, completed_at__lt=end, state__in=("passed", "failed")
        )
    )
    failed = readable(principal, FailedQuery.objects.all(), space).filter(
        created_at__gte=start, created_at__lt=end
    )
    return {"pass_rate": _pass_rate(runs), "failed_queries": failed.count(),
            "total_replays": len(runs), "_runs": runs, "_failed": failed}  # fmt: skip


def trends(principal, space, params) -> dict:
    name, width, end = _window(params)
    current = _period(principal, space, end - width, end)
    baseline = _period(principal, space, end - 2 * width, end - width)
    cases = Counter(
        readable(principal, BadCase.objects.all(), space).values_list("status", flat=True)
    )
    slices: dict[tuple, list] = defaultdict(list)
    for run in current["_runs"]:
        snapshot = run.frozen_snapshot or {}
        key = (run.mode, snapshot.get("embedding_model"),
               (snapshot.get("retrieval_profile") or {}).get("revision"))  # fmt: skip
        slices[key].append(run)
    by_mode = Counter(current["_failed"].values_list("mode", flat=True))
    unanswered: dict[str, list] = defaultdict(list)
    for query in current["_failed"].filter(trigger="not-enough-evidence").exclude(query="")\
            .order_by("-created_at").values_list("query", flat=True)[:5000]:  # fmt: skip
        unanswered[cluster_key(query)].append(query)
    top = sorted(unanswered.values(), key=len, reverse=True)[:10]
    return {
        "window": name,
        "from": (end - width).isoformat(),
        "to": end.isoformat(),
        "baseline": {k: v for k, v in baseline.items() if not k.startswith("_")},
        "current": {
            **{k: v for k, v in current.items() if not k.startswith("_")},
            "bad_cases": {s: cases.get(s, 0) for s in BadCase.STATUSES},
        },
        "slices": [
            {
                "mode": mode,
                "model": model,
                "profile_revision": revision,
                "pass_rate": _pass_rate(runs),
                "replay_runs": len(runs),
                "failed_queries": by_mode.get(mode, 0),
            }
            for (mode, model, revision), runs in sorted(slices.items(), key=str)
        ],  # fmt: skip
        "top_unanswered": [{"query": group[0], "count": len(group)} for group in top],
        "daily": _daily(current, end, width),
    }


def _daily(current: dict, end: datetime, width: timedelta) -> list[dict]:
    days = max(1, round(width / timedelta(days=1)))
    first = (end - timedelta(days=days - 1)).date()
    series: dict[date, _Day] = {
        first + timedelta(days=n): {"runs": [], "failed": Counter()} for n in range(days)
    }
    for run in current["_runs"]:
        day = timezone.localtime(run.completed_at).date()
        if day in series:
            series[day]["runs"].append(run)
    for created, verdict in current["_failed"].values_list("created_at", "verdict"):
        day = timezone.localtime(created).date()
        if day in series:
            series[day]["failed"][verdict or "untriaged"] += 1
    return [
        {"day": day.isoformat(), "pass_rate": _pass_rate(v["runs"]),
         "failed_queries": dict(v["failed"])}
        for day, v in sorted(series.items())
    ]  # fmt: skip
