"""An empty or whitespace-only query is 400 ``invalid_query`` on every retrieval route.

Whitespace means what a user can type or paste and not see: ASCII spaces, tabs and newlines,
no-break and ideographic spaces, and the invisible format characters (zero-width space, joiner,
byte-order mark) that str.strip() keeps. Each route answers 400 with the stable code before any
model or index is touched; the routes that share ``retrieval.recall.validate_request``
(retrieval tests, the MCP search tools, ``kfs search``) are covered through ``retrieve``.
"""

from __future__ import annotations

import pytest

from knowledgefs.errors import InvalidInput
from retrieval.modes import retrieve

pytestmark = pytest.mark.django_db

BLANK = ["", " ", "\t\n \r", "\u3000", "\u00a0\u2003", "\u200b", "\ufeff \u200b\u2060", "\u200d\n"]


def _assert_refused(response, field: str = "query") -> None:
    assert response.status_code == 400, (response.status_code, response.content[:200])
    body = response.json()
    assert body["code"] == "invalid_query", body
    assert field in body["message"], body


@pytest.mark.parametrize("query", BLANK)
def test_a_blank_query_is_400_invalid_query_on_every_route(client, space, query):
    base = f"/v1/knowledge-spaces/{space.id}"
    _assert_refused(client.post(f"{base}/retrieval-tests", {"query": query}, format="json"))
    for mode in ("fast", "deep", "research"):
        _assert_refused(
            client.post(f"{base}/retrieval-tests", {"query": query, "mode": mode}, format="json")
        )
    answer = {"space_id": str(space.id), "query": query}
    _assert_refused(client.post("/v1/queries", answer, format="json"))
    for url in ("/v1/research-tasks/plan", "/v1/research-tasks"):
        _assert_refused(client.post(url, answer, format="json"))
    grep = client.get(f"{base}/fs/grep", {"q": query, "path": "/knowledge", "limit": 5})
    _assert_refused(grep, field="q")
    for mode in ("fast", "deep", "research", "auto"):
        with pytest.raises(InvalidInput) as refused:
            retrieve(space, query, mode=mode)
        assert refused.value.code == "invalid_query"
