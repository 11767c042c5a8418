#!/usr/bin/env bash
# Run the API (gunicorn on 127.0.0.1:8787) and a django-q2 worker cluster until interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
"$BIN/python" manage.py qcluster &
worker=$!
trap 'kill $worker 2>/dev/null || true' EXIT INT TERM
# Threaded workers (gthread): the upload admission gate and its limits are per process, so a
# process serves several requests at once and queues uploads in its own gate; a stalled upload
# holds one thread for at most KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS.
"$BIN/gunicorn" knowledgefs.wsgi --bind "${KNOWLEDGE_BIND:-127.0.0.1:8787}" \
  --workers "${KNOWLEDGE_API_WORKERS:-2}" --threads "${KNOWLEDGE_API_THREADS:-8}" \
  --timeout 120 --access-logfile -
