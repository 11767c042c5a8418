"""Settings of the search backends, retrieval and the upgrade bridge.

Sections, in order: PostgreSQL + pgvector, the Dify vector and text bridge, the planner and
Deep mode, Research and Auto, durable research tasks, cited answers, golden questions, and the
upgrade bridge's staged run, document reconciliation and workspace cutover.
"""

from __future__ import annotations

from knowledgefs.settings.values import bounded_int, env

# --- Search backends: PostgreSQL + pgvector -------------------------------------------------------
# HNSW per model and dimension, docs/scaling.md.
# HNSW build parameters of each (model, dimension) index (pgvector's defaults: m 16,
# ef_construction 64; pgvector needs ef_construction >= 2 * m). Read when an index is created.
KNOWLEDGE_PG_HNSW_M = bounded_int("KNOWLEDGE_PG_HNSW_M", 16, 2, 100)
KNOWLEDGE_PG_HNSW_EF_CONSTRUCTION = bounded_int("KNOWLEDGE_PG_HNSW_EF_CONSTRUCTION", 64, 4, 1000)
# Candidate list of an HNSW search (hnsw.ef_search; raised to the query's depth when smaller).
# 400, not pgvector's 40 or our first 100: at 1M chunks recall@10 against exact search was 0.64
# at 100 and 0.81 at 400 (0.934 and 0.9935 at 100k), with the dense leg at 10-45 ms either way
# (docs/benchmarks.md, "Scale curve").
KNOWLEDGE_PG_HNSW_EF_SEARCH = bounded_int("KNOWLEDGE_PG_HNSW_EF_SEARCH", 400, 10, 1000)
# Most index tuples an iterative scan visits to find enough rows that pass the filters
# (hnsw.max_scan_tuples, pgvector's default 20000); when it runs out first, the query is
# answered by an exact scan of the space's rows instead.
KNOWLEDGE_PG_HNSW_MAX_SCAN_TUPLES = bounded_int(
    "KNOWLEDGE_PG_HNSW_MAX_SCAN_TUPLES", 20000, 1000, 10000000
)

# --- Search backends: the in-process dense matrix (SQLite) --------------------------------------
# An HNSW graph (faiss) over a space's matrix once it holds this many rows (0: always exact);
# below it every search scans the matrix exactly (retrieval/backends/dense_graph.py; at 1M
# chunks the exact dense leg took 127 ms p50, the graph's 4 ms; docs/scaling.md).
KNOWLEDGE_DENSE_GRAPH_MIN_ROWS = bounded_int("KNOWLEDGE_DENSE_GRAPH_MIN_ROWS", 250000, 0, 10**9)
# The graph walk's candidate list (efSearch; raised to the search's depth when smaller). 2000:
# recall@10 0.9915 against the exact scan at 1M chunks of near-copies (0.928 at 400, 0.9715 at
# 1000), 4.3 ms p50 (docs/scaling.md).
KNOWLEDGE_DENSE_GRAPH_EF_SEARCH = bounded_int("KNOWLEDGE_DENSE_GRAPH_EF_SEARCH", 2000, 10, 4000)

# --- Search backends: the Dify vector and text bridge ---------------------------------------------
# Inventory 7.2-7.3, docs/scaling.md.
# database (default): the keyword and dense projections live with this service (tantivy or
# tsvector, exact dense search). dify: they live in Dify's vector store (Qdrant, Elasticsearch,
# Weaviate...) through POST /inner/api/knowledge-fs/texts and /vectors; relational state, and
# the SQL that decides which ids a search may return, stay here (docs/architecture.md).
KNOWLEDGE_SEARCH_BACKEND = env.str("KNOWLEDGE_SEARCH_BACKEND", default="database").strip().lower()
# One bridge request (retries included), in ms.
DIFY_VECTOR_STORE_REQUEST_TIMEOUT_MS = bounded_int(
    "DIFY_VECTOR_STORE_REQUEST_TIMEOUT_MS", 30000, 100, 600000
)
# Chunk searches (2048 authorized ids each) of one search leg in flight at once.
KNOWLEDGE_SEARCH_BRIDGE_CONCURRENCY = bounded_int("KNOWLEDGE_SEARCH_BRIDGE_CONCURRENCY", 4, 1, 32)

# --- Retrieval: planner, Deep mode, filters and retrieval tests -----------------------------------
# docs/retrieval.md, "Modes".
RETRIEVAL_MAX_TOP_K = 100
RETRIEVAL_MAX_QUERY_CHARS = 16000

# --- Retrieval: Research and Auto -----------------------------------------------------------------
# Reasoning-model budgets; docs/retrieval.md, "Research and Auto".
# Seed deployment guide: per planner/judge call a 60 s deadline and an 8,192-token output ceiling
# (so hidden reasoning tokens do not force a second call); the initial Research rerank pool,
# shared fairly across the original query and up to three planned intents, defaults to and is
# capped at 200 candidates.
KNOWLEDGE_RESEARCH_REASONING_TIMEOUT_MS = bounded_int(
    "KNOWLEDGE_RESEARCH_REASONING_TIMEOUT_MS", 60000, 100, 600000
)
KNOWLEDGE_RESEARCH_REASONING_MAX_OUTPUT_TOKENS = bounded_int(
    "KNOWLEDGE_RESEARCH_REASONING_MAX_OUTPUT_TOKENS", 8192, 256, 65536
)
KNOWLEDGE_RESEARCH_MAX_RERANK_CANDIDATES = bounded_int(
    "KNOWLEDGE_RESEARCH_MAX_RERANK_CANDIDATES", 200, 1, 200
)


# --- Retrieval: the local reranker (KNOWLEDGE_MODEL_RUNTIME=local) --------------------------------
# docs/retrieval.md, "Local reranker". ms-marco-MiniLM-L-12-v2 int8 (knowledgefs/runtime/
# local_rerank.py) reranks Deep's and Research's first candidates, and Fast's when the space's
# retrieval profile enables rerank. 0 turns it off (Deep and Research then keep the fused order).
KNOWLEDGE_LOCAL_RERANK_ENABLED = bounded_int("KNOWLEDGE_LOCAL_RERANK_ENABLED", 1, 0, 1) == 1
# Candidates reranked per query (the rest keep their first-stage order below them): 20. On SciFact
# train (bench/calibrate_fusion.py, 2026-12-03, 32 claims) N 15, 20, 25 and 30 gave the same
# nDCG@10 with the fitted mix, so the cheaper 20 stays (docs/benchmarks.md).
KNOWLEDGE_LOCAL_RERANK_TOP_N = bounded_int("KNOWLEDGE_LOCAL_RERANK_TOP_N", 20, 1, 100)
# A query's rerank gives up after this long (the fused order is served, stage "rerank" degraded).
KNOWLEDGE_LOCAL_RERANK_TIMEOUT_MS = bounded_int(
    "KNOWLEDGE_LOCAL_RERANK_TIMEOUT_MS", 4000, 100, 60000
)
# Queries reranking at once in one process (the others wait for a place within their deadline),
# pairs per model call (1: the int8 model quantises activations per call, so in a batch a pair's
# score would depend on its neighbours; batches were no faster on 2 cores, docs/models.md), and
# onnxruntime threads per call (0 = every core).
KNOWLEDGE_LOCAL_RERANK_CONCURRENCY = bounded_int("KNOWLEDGE_LOCAL_RERANK_CONCURRENCY", 1, 1, 16)
KNOWLEDGE_LOCAL_RERANK_BATCH_SIZE = bounded_int("KNOWLEDGE_LOCAL_RERANK_BATCH_SIZE", 1, 1, 64)
KNOWLEDGE_LOCAL_RERANK_THREADS = bounded_int("KNOWLEDGE_LOCAL_RERANK_THREADS", 0, 0, 64)


# --- Retrieval: durable research tasks ------------------------------------------------------------
# docs/retrieval.md, "Research tasks".
# Durable runs of Research mode on the worker queue (retrieval.research_tasks). The per-task
# wall clock defaults to and is capped at the durable Research budget of 180 s (issue: "durable
# 180 s"); a delivery's django-q2 timeout is that budget + 30 s, so a running task is stale (its
# worker died) only after KNOWLEDGE_RESEARCH_TASK_STALE_SECONDS, which must exceed 210 s.
KNOWLEDGE_RESEARCH_TASK_TIMEOUT_MS = bounded_int(
    "KNOWLEDGE_RESEARCH_TASK_TIMEOUT_MS", 180000, 1000, 180000
)
KNOWLEDGE_RESEARCH_TASK_MAX_ATTEMPTS = bounded_int("KNOWLEDGE_RESEARCH_TASK_MAX_ATTEMPTS", 3, 1, 10)
KNOWLEDGE_RESEARCH_TASK_STALE_SECONDS = bounded_int(
    "KNOWLEDGE_RESEARCH_TASK_STALE_SECONDS", 300, 240, 3600
)
KNOWLEDGE_RESEARCH_TASK_DISPATCH_GRACE_SECONDS = bounded_int(
    "KNOWLEDGE_RESEARCH_TASK_DISPATCH_GRACE_SECONDS", 120, 10, 3600
)
# Active (queued + running) tasks per owner (API key / capability subject) and per tenant:
# one caller's burst must not fill the shared worker queue (429 research_task_limit).
KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_OWNER = bounded_int(
    "KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_OWNER", 5, 1, 1000
)
KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_TENANT = bounded_int(
    "KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_TENANT", 20, 1, 10000
)
# The plan estimate reads the Research section's KNOWLEDGE_RESEARCH_REASONING_* budgets.


# --- Retrieval: cited answers over SSE and answer traces ------------------------------------------
# docs/retrieval.md, "Answers".
# The evidence window: the reasoning model's context size comes from the Dify model catalog;
# this is the size used when the catalog gives none (and for extractive answers).
KNOWLEDGE_ANSWER_CONTEXT_TOKENS = bounded_int(
    "KNOWLEDGE_ANSWER_CONTEXT_TOKENS", 8192, 1024, 2000000
)
# Output reservation of the window (at most a quarter of it); also the LLM's max_tokens.
KNOWLEDGE_ANSWER_MAX_OUTPUT_TOKENS = bounded_int(
    "KNOWLEDGE_ANSWER_MAX_OUTPUT_TOKENS", 1024, 64, 32768
)
# Answerability: items needed at or above the score for "answerable" (else "partial").
KNOWLEDGE_ANSWER_MIN_ITEMS = bounded_int("KNOWLEDGE_ANSWER_MIN_ITEMS", 1, 1, 20)
KNOWLEDGE_ANSWER_MIN_FINAL_SCORE_PERCENT = bounded_int(
    "KNOWLEDGE_ANSWER_MIN_FINAL_SCORE_PERCENT", 30, 0, 100
)
KNOWLEDGE_ANSWER_MIN_FINAL_SCORE = KNOWLEDGE_ANSWER_MIN_FINAL_SCORE_PERCENT / 100
# Answerability's absolute signals (fused scores are relative): the raw query–evidence cosine
# of the dense leg, and the share of the question's content words one item holds. Defaults
# calibrated on SciFact claims vs off-topic questions (docs/retrieval.md, "Answerability").
# The cosine floor applies to models served through Dify; each local model carries its own
# (knowledgefs/runtime/local_embedding.py: bge-small-en-v1.5 0.62, all-MiniLM-L6-v2 0.35).
KNOWLEDGE_ANSWER_MIN_DENSE_SIMILARITY_PERCENT = bounded_int(
    "KNOWLEDGE_ANSWER_MIN_DENSE_SIMILARITY_PERCENT", 35, 0, 100
)
KNOWLEDGE_ANSWER_MIN_DENSE_SIMILARITY = KNOWLEDGE_ANSWER_MIN_DENSE_SIMILARITY_PERCENT / 100
KNOWLEDGE_ANSWER_MIN_TERM_COVERAGE_PERCENT = bounded_int(
    "KNOWLEDGE_ANSWER_MIN_TERM_COVERAGE_PERCENT", 50, 1, 100
)
KNOWLEDGE_ANSWER_MIN_TERM_COVERAGE = KNOWLEDGE_ANSWER_MIN_TERM_COVERAGE_PERCENT / 100
# Extractive answers (no reasoning model): at most this many sentences.
KNOWLEDGE_ANSWER_EXTRACTIVE_SENTENCES = bounded_int(
    "KNOWLEDGE_ANSWER_EXTRACTIVE_SENTENCES", 3, 1, 20
)
# Longest answer, in UTF-8 bytes; a longer one is cut at a character boundary (truncated: true).
KNOWLEDGE_ANSWER_MAX_BYTES = bounded_int("KNOWLEDGE_ANSWER_MAX_BYTES", 65536, 1024, 1048576)
# A streamed answer whose model is silent this long gets an SSE comment (": heartbeat"), so
# proxies and clients with idle timeouts keep the stream open.
KNOWLEDGE_ANSWER_HEARTBEAT_SECONDS = bounded_int("KNOWLEDGE_ANSWER_HEARTBEAT_SECONDS", 15, 1, 300)
# How long a catalog lookup of a reasoning model's context size is reused by this process.
KNOWLEDGE_ANSWER_CATALOG_CACHE_SECONDS = bounded_int(
    "KNOWLEDGE_ANSWER_CATALOG_CACHE_SECONDS", 300, 0, 86400
)


# --- Retrieval: golden questions and the evaluation gate ------------------------------------------
# docs/retrieval.md, "Evaluation".
# At most this many golden questions per space (a run retrieves once per question).
KNOWLEDGE_GOLDEN_MAX_QUESTIONS_PER_SPACE = bounded_int(
    "KNOWLEDGE_GOLDEN_MAX_QUESTIONS_PER_SPACE", 1000, 1, 100000
)

# --- Upgrade bridge: staged run -------------------------------------------------------------------
# Snapshot, steps, claims, sweeps, file leases.
# docs/upgrades.md "Staged run" and docs/configuration.md. G5 of the bridge specification: the
# wait for a new space is bounded by time (the reference's 360 retries x 5 s = about 30 min).
KNOWLEDGE_UPGRADE_SPACE_WAIT_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_SPACE_WAIT_SECONDS", 1800, 60, 86400
)
# A claimed step that was never delivered is claimed again after this many seconds (G1).
KNOWLEDGE_UPGRADE_DISPATCH_GRACE_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_DISPATCH_GRACE_SECONDS", 120, 10, 3600
)
# One step's django-q2 timeout (a step is one storage read and one admission, or one space
# call): the worker is killed past it. A running step older than the stale limit is taken back
# by the sweep (G2); the limit must outlast the step timeout, so django-q2 has stopped a live
# worker before its step is handed to another.
KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS", 300, 30, 3600
)
KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS", KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS + 60, 60, 7200
)
# Deliveries one step may start before the job is failed with attempts_exhausted.
KNOWLEDGE_UPGRADE_STEP_MAX_ATTEMPTS = bounded_int("KNOWLEDGE_UPGRADE_STEP_MAX_ATTEMPTS", 5, 1, 50)
# Not read from the environment: a dotted django-q2 broker class for the upgrade step messages
# only ("" = the cluster's broker). Tests select a broker that refuses every message.
KNOWLEDGE_UPGRADE_BROKER_CLASS = ""

# --- Upgrade bridge: document reconciliation ------------------------------------------------------
# Lease, batches, recovery schedule, dead letter.
# docs/configuration.md, "Upgrade document reconciliation". The lease TTL bounds how long a lost
# delivery stalls a space (recovery re-issues after expiry); a delivery stops its batch once its
# time budget is spent, and the budget must stay at most half the TTL so a live worker always
# finishes before its lease can be re-issued (at most one effective worker per lease).
KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS", 300, 30, 3600
)
KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS", 60, 5, 1800
)
KNOWLEDGE_UPGRADE_RECONCILE_BATCH_SIZE = bounded_int(
    "KNOWLEDGE_UPGRADE_RECONCILE_BATCH_SIZE", 50, 1, 1000
)
KNOWLEDGE_UPGRADE_RECONCILE_MAX_ATTEMPTS = bounded_int(
    "KNOWLEDGE_UPGRADE_RECONCILE_MAX_ATTEMPTS", 20, 1, 1000
)
KNOWLEDGE_UPGRADE_RECONCILE_RETRY_DELAY_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_RECONCILE_RETRY_DELAY_SECONDS", 60, 0, 3600
)
KNOWLEDGE_UPGRADE_RECONCILE_RECOVERY_BATCH = bounded_int(
    "KNOWLEDGE_UPGRADE_RECONCILE_RECOVERY_BATCH", 100, 1, 1000
)


# --- Upgrade bridge: workspace cutover ledger, runtime gate and cleanup authorizations ------------
# Windows start at the cutover (or the observing step); see docs/upgrades.md for what each fences.
KNOWLEDGE_CUTOVER_ROLLBACK_WINDOW_SECONDS = bounded_int(
    "KNOWLEDGE_CUTOVER_ROLLBACK_WINDOW_SECONDS", 14 * 86400, 3600, 90 * 86400
)
KNOWLEDGE_CUTOVER_OBSERVATION_SECONDS = bounded_int(
    "KNOWLEDGE_CUTOVER_OBSERVATION_SECONDS", 86400, 60, 30 * 86400
)
KNOWLEDGE_CUTOVER_MAX_TASK_TTL_SECONDS = bounded_int(
    "KNOWLEDGE_CUTOVER_MAX_TASK_TTL_SECONDS", 7 * 86400, 60, 30 * 86400
)
KNOWLEDGE_CLEANUP_APPROVAL_SECONDS = bounded_int(
    "KNOWLEDGE_CLEANUP_APPROVAL_SECONDS", 86400, 300, 7 * 86400
)


# --- Quality loop: failed-query capture, replay runs (docs/quality.md) ---------------------------
# An answer whose best absolute relevance signal (reranker score, else raw dense cosine) is under
# this percentage is captured as a low-confidence failed query; 0 turns the rule off. The default
# sits above the answerability floor (KNOWLEDGE_ANSWER_MIN_DENSE_SIMILARITY_PERCENT, 35): answered,
# but on weak evidence.
KNOWLEDGE_QUALITY_LOW_CONFIDENCE_PERCENT = bounded_int(
    "KNOWLEDGE_QUALITY_LOW_CONFIDENCE_PERCENT", 45, 0, 100
)
# Replay runs (the jobs kernel's claims): an undelivered claim is taken back after the grace; a
# running replay that wrote nothing for the stale time (its worker died) is requeued, and failed
# attempts_exhausted after this many deliveries.
KNOWLEDGE_QUALITY_REPLAY_DISPATCH_GRACE_SECONDS = bounded_int(
    "KNOWLEDGE_QUALITY_REPLAY_DISPATCH_GRACE_SECONDS", 120, 5, 3600
)
KNOWLEDGE_QUALITY_REPLAY_STALE_SECONDS = bounded_int(
    "KNOWLEDGE_QUALITY_REPLAY_STALE_SECONDS", 300, 5, 86400
)
KNOWLEDGE_QUALITY_REPLAY_MAX_ATTEMPTS = bounded_int(
    "KNOWLEDGE_QUALITY_REPLAY_MAX_ATTEMPTS", 5, 1, 50
)
# Triage's reasoning-model judge (a space whose profile names a reasoning model): the deadline of
# one verdict call, its retries and its stream; past it the row is labelled by the other signals.
# Never above KNOWLEDGE_RESEARCH_REASONING_TIMEOUT_MS.
KNOWLEDGE_QUALITY_TRIAGE_JUDGE_TIMEOUT_MS = bounded_int(
    "KNOWLEDGE_QUALITY_TRIAGE_JUDGE_TIMEOUT_MS", 15000, 100, 600000
)
