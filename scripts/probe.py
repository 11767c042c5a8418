"""HTTP probe for container health checks and start-up gates (stdlib only: the image has no
curl). Usage: ``python scripts/probe.py URL [--wait SECONDS] [--timeout SECONDS]``.

Exit status 0 when ``GET URL`` answers 200, 1 otherwise. With ``--wait`` the request is repeated
every 2 s until it answers 200 or the wait is over (a readiness gate: ``/ready`` answers 503
until every enabled capability is assembled, docs/operations.md "Readiness"). ``--timeout``
bounds one request (default 3 s, below Compose's 5 s health-check timeout).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request

RETRY_SECONDS = 2.0


def probe(url: str, timeout: float) -> tuple[bool, str]:
    """One ``GET url``: ``(True, "200")`` on HTTP 200, else ``(False, reason)``; never raises
    for network errors."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - operator URL
            return response.status == 200, str(response.status)
    except urllib.error.HTTPError as exc:
        return False, str(exc.code)
    except (OSError, ValueError) as exc:
        return False, f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("url")
    parser.add_argument("--wait", type=float, default=0.0, help="seconds to keep trying")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per request")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.wait
    while True:
        ok, reason = probe(args.url, args.timeout)
        if ok:
            return 0
        if time.monotonic() + RETRY_SECONDS > deadline:
            print(f"{args.url}: {reason}", file=sys.stderr)
            return 1
        time.sleep(RETRY_SECONDS)


if __name__ == "__main__":
    sys.exit(main())
