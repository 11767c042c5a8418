#!/usr/bin/env bash
# Run the API (gunicorn on 127.0.0.1:8787) and a django-q2 worker cluster until interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
# Both run in the background and this shell waits for them: a shell does not run a trap while a
# foreground child runs, so SIGTERM to this shell alone (kill PID) would otherwise wait for
# gunicorn to exit first. On SIGTERM or SIGINT both are told to stop and awaited; the worker
# hands its running jobs back and ends within KNOWLEDGE_WORKER_SHUTDOWN_GRACE_SECONDS
# (docs/operations.md, "Stopping a worker").
"$BIN/python" manage.py qcluster &
worker=$!
api=""
stop() {
  trap - INT TERM EXIT
  kill -TERM $worker $api 2>/dev/null || true
  wait $worker $api 2>/dev/null || true
}
trap 'stop; exit 143' TERM
trap 'stop; exit 130' INT
trap stop EXIT
# Threaded workers (gthread): the upload admission gate and its limits are per process, so a
# process serves several requests at once and queues uploads in its own gate; a stalled upload
# holds one thread for at most KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS.
# Idle keep-alive connections are kept 75 s (gunicorn's default is 2 s), longer than the idle
# time of the clients and proxies in front (httpx 5 s, nginx upstream 60 s): a client then closes
# first, and never sends a request into a connection the server is closing at that instant (a
# reset: measured under load, docs/benchmarks.md "Load test"). An idle connection holds no thread.
"$BIN/gunicorn" knowledgefs.wsgi --bind "${KNOWLEDGE_BIND:-127.0.0.1:8787}" \
  --workers "${KNOWLEDGE_API_WORKERS:-2}" --threads "${KNOWLEDGE_API_THREADS:-8}" \
  --keep-alive "${KNOWLEDGE_API_KEEPALIVE_SECONDS:-75}" --timeout 120 --access-logfile - &
api=$!
# Either process ending ends the other (wait -n returns when the first one exits).
wait -n $worker $api || true
