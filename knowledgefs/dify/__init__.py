"""Clients of Dify's inner API: the only way KnowledgeFS reaches models, objects and datasources.

In production KnowledgeFS holds no model, datasource or storage credential. Dify does, and
KnowledgeFS calls Dify's inner API (``DIFY_INNER_API_URL``) with the inner key
(``DIFY_INNER_API_KEY``, header ``X-Inner-Api-Key``). One module per Dify surface:

- :mod:`.transport`: the shared transport (pooled session, deadlines, retries), with
  :mod:`.stream` (capped body reads), :mod:`.envelope` (JSON and ``{data, error}``),
  :mod:`.frames` (length-prefixed frames) and :mod:`.redaction` (safe messages);
- :mod:`.model_runtime`: embeddings, rerank, LLM streams and the model catalog;
  :mod:`.embedding_model`: ``DifyEmbeddingModel`` for :mod:`knowledgefs.runtime`;
- :mod:`.object_storage`: ``DifyObjectStorage``, a Django ``Storage``;
- :mod:`.datasources`: credential validation and browsing by Dify-managed ``credential_id``;
- :mod:`.errors`: typed errors with stable codes and a ``retryable`` flag.

See docs/dify-boundary.md. This package imports nothing at import time, so settings can use
:mod:`.config`.
"""
