"""Locust users for the load test (``bench/load/run.py`` starts this; never imported by tests).

Each simulated client holds one of the run's API keys (bound to the load-test space) and mixes:

- **upload** a real document (multipart, ``Idempotency-Key``); one upload in ``REPLAY_EVERY`` is
  sent a second time with the same key and must come back with ``Idempotent-Replayed: true`` and
  the same document id;
- **Fast retrieval** (most requests), **Deep retrieval** (some) through
  ``POST /v1/knowledge-spaces/{id}/retrieval-tests``, and an answer in Fast mode through
  ``POST /v1/queries`` (server-sent events, read to ``answer.done``);
- **poll** one of its accepted documents, and **list** the space's documents.

Documents come from ``config["corpus"]`` (built by ``run.py``): real files (``docs/*.md``,
``../shared/data/sample-docs``, SciFact abstracts) in a seeded order, each sent once; text
documents get a ``copy N`` header when the pool wraps so that every upload is new content.

Outcomes: a documented admission (429 ``upload_admission_busy`` or ``rate_limited``, 408
``upload_timeout``) is marked as a success in Locust's statistics and counted apart; anything
else unexpected is a Locust failure. At the end every accepted upload (document id, job id,
status) and the counters are written to ``config["client_report"]`` as JSON for the audit.

Configuration: env ``LOAD_CONFIG`` = path of the JSON file ``run.py`` writes (keys, space id,
corpus, query texts, report path).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
import uuid
from collections import Counter
from pathlib import Path

from locust import HttpUser, between, events, task

CONFIG = json.loads(Path(os.environ["LOAD_CONFIG"]).read_text(encoding="utf-8"))
SPACE = CONFIG["space_id"]
REPLAY_EVERY = int(CONFIG.get("replay_every", 5))
# Documented admissions (docs/api.md): (status, code).
ADMISSIONS = {(429, "upload_admission_busy"), (429, "rate_limited"), (408, "upload_timeout")}

_lock = threading.Lock()
_sequence = itertools.count()
_key_turn = itertools.count()
_user_turn = itertools.count()
_accepted: list[dict] = []
_admissions: Counter = Counter()
_errors: list[dict] = []
_statuses: Counter = Counter()


def _document(n: int) -> tuple[str, bytes]:
    """The ``n``-th upload: a corpus item, with a ``copy N`` header after the pool wraps."""
    corpus = CONFIG["corpus"]
    item = corpus[n % len(corpus)]
    data = item["content"].encode() if "content" in item else Path(item["path"]).read_bytes()
    round_ = n // len(corpus)
    if round_ == 0:
        return item["name"], data
    if not item["text"]:
        return "", b""  # a binary file is sent once: the same bytes again are a duplicate
    header = f"# Copy {round_} of {item['name']}\n\n".encode()
    return f"copy-{round_}-{item['name']}", header + data


def _code(response) -> str:
    try:
        return str(response.json().get("code", ""))
    except ValueError:
        return ""


def _judge(response, name: str, expected: tuple[int, ...]) -> bool:
    """Mark ``response`` (a ``catch_response`` context); True when it is an expected success."""
    status = response.status_code
    with _lock:
        _statuses[f"{name} {status}"] += 1
    if status in expected:
        response.success()
        return True
    code = _code(response)
    if (status, code) in ADMISSIONS:
        with _lock:
            _admissions[f"{status} {code}"] += 1
        response.success()
        return False
    # Status 0: no HTTP answer at all; ``response.error`` holds the connection error.
    error = repr(response.error)[:300] if status == 0 else ""
    detail = {"route": name, "status": status, "code": code, "body": (response.text or "")[:300],
              "error": error}  # fmt: skip
    with _lock:
        _errors.append(detail)
    response.failure(f"{status} {code or error or (response.text or '')[:120]}")
    return False


class KnowledgeClient(HttpUser):
    """One API client: a key, its own accepted documents, and the weighted task mix."""

    wait_time = between(CONFIG.get("wait_min", 0.5), CONFIG.get("wait_max", 2.0))

    def on_start(self) -> None:
        keys = CONFIG["keys"]
        self.key = keys[next(_key_turn) % len(keys)]
        self.mine: list[str] = []
        self.rng = random.Random(CONFIG.get("seed", 7) + next(_user_turn))

    def headers(self, **extra) -> dict:
        return {"Authorization": f"Bearer {self.key}", **extra}

    # --- uploads ------------------------------------------------------------------------
    @task(CONFIG["weights"]["upload"])
    def upload(self) -> None:
        with _lock:
            n = next(_sequence)
        filename, data = _document(n)
        if not data:
            return
        key = f"load-{uuid.uuid4()}"
        body = self._post_upload(filename, data, key, "upload")
        if body is not None and n % REPLAY_EVERY == 0:
            again = self._post_upload(filename, data, key, "upload (replay)", replay_of=body)
            if again is None:
                return

    def _post_upload(self, filename, data, key, name, replay_of=None):
        url = f"/v1/knowledge-spaces/{SPACE}/documents"
        with self.client.post(
            url,
            files={"file": (filename, data)},
            headers=self.headers(**{"Idempotency-Key": key}),
            name=name,
            catch_response=True,
        ) as response:
            if not _judge(response, name, (201, 202)):
                return None
            body = response.json()
            document = body.get("document") or {}
            if replay_of is not None:
                same = document.get("id") == replay_of["document"]["id"]
                if response.headers.get("Idempotent-Replayed") != "true" or not same:
                    response.failure("replay did not return the first response")
                    error = {"route": name, "status": response.status_code,
                             "code": "replay_mismatch", "body": response.text[:300]}  # fmt: skip
                    with _lock:
                        _errors.append(error)
                    return None
                return body
            if not document.get("id"):
                response.failure("accepted upload without a document id")
                return None
            with _lock:
                _accepted.append({
                    "document_id": document["id"], "job_id": (body.get("job") or {}).get("id"),
                    "filename": filename, "bytes": len(data), "status": response.status_code,
                    "created": body.get("created"),
                })  # fmt: skip
            self.mine.append(document["id"])
            return body

    # --- queries ------------------------------------------------------------------------
    def _retrieval(self, mode: str) -> None:
        query = self.rng.choice(CONFIG["queries"])
        with self.client.post(
            f"/v1/knowledge-spaces/{SPACE}/retrieval-tests",
            json={"query": query, "mode": mode, "top_k": 10},
            headers=self.headers(),
            name=f"retrieval {mode}",
            catch_response=True,
        ) as response:
            if _judge(response, f"retrieval {mode}", (200,)) and "items" not in response.json():
                response.failure("no items in a retrieval answer")

    @task(CONFIG["weights"]["fast"])
    def fast(self) -> None:
        self._retrieval("fast")

    @task(CONFIG["weights"]["deep"])
    def deep(self) -> None:
        self._retrieval("deep")

    @task(CONFIG["weights"]["answer"])
    def answer(self) -> None:
        query = self.rng.choice(CONFIG["queries"])
        with self.client.post(
            "/v1/queries",
            json={"space_id": SPACE, "query": query, "mode": "fast"},
            headers=self.headers(Accept="text/event-stream"),
            name="answer fast (SSE)",
            catch_response=True,
        ) as response:
            if _judge(response, "answer fast (SSE)", (200,)):
                text = response.text
                if "event: answer.done" not in text:
                    response.failure(f"stream ended without answer.done: {text[-200:]}")
                    with _lock:
                        _errors.append({"route": "answer fast (SSE)", "status": 200,
                                        "code": "no_answer_done", "body": text[-300:]})  # fmt: skip

    # --- reads --------------------------------------------------------------------------
    @task(CONFIG["weights"]["poll"])
    def poll(self) -> None:
        if not self.mine:
            return
        document_id = self.rng.choice(self.mine[-20:])
        with self.client.get(
            f"/v1/knowledge-spaces/{SPACE}/documents/{document_id}",
            headers=self.headers(),
            name="document status",
            catch_response=True,
        ) as response:
            _judge(response, "document status", (200,))

    @task(CONFIG["weights"]["list"])
    def listing(self) -> None:
        with self.client.get(
            f"/v1/knowledge-spaces/{SPACE}/documents?limit=20",
            headers=self.headers(),
            name="list documents",
            catch_response=True,
        ) as response:
            _judge(response, "list documents", (200,))


@events.test_stop.add_listener
def _write_report(**_kwargs) -> None:
    """Write what the clients saw for ``run.py``'s audit."""
    with _lock:
        report = {
            "accepted": list(_accepted),
            "admissions": dict(_admissions),
            "errors": list(_errors),
            "statuses": dict(_statuses),
            "uploads_started": next(_sequence),
        }
    Path(CONFIG["client_report"]).write_text(json.dumps(report, indent=1), encoding="utf-8")
