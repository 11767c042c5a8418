"""MCP tool inputs of the wrong JSON type are refused with a service error (a tool error with
a code), never an exception that escapes as a server error."""

import pytest

from knowledgefs.errors import ServiceError
from retrieval.fs import tools

pytestmark = pytest.mark.django_db

BAD = [
    ("knowledge.fs.ls", {"path": 5, "limit": 5}),
    ("knowledge.fs.ls", {"path": "/knowledge", "limit": "abc"}),
    ("knowledge.fs.ls", {"path": "/knowledge", "limit": 5, "cursor": 7}),
    ("knowledge.fs.tree", {"path": "/knowledge", "limit": 5, "depth": True}),
    ("knowledge.fs.grep", {"q": ["x"], "path": "/knowledge", "limit": 5}),
    ("knowledge.fs.open_node", {"nodeId": 5}),
    ("knowledge.fs.open_node", {"nodeId": {"a": 1}}),
    ("knowledge.get_document_outline", {"documentId": {"a": 1}}),
    ("knowledge.get_document_outline", {"documentId": [1]}),
    ("knowledge.shell.execute", {"command": 5}),
    ("knowledge.search", {"query": 5}),
    ("knowledge.search", {"query": "x", "topK": "5"}),
    ("knowledge.fs.find", {"path": "/knowledge", "limit": 5, "nameContains": 5}),
    ("knowledge.fs.diff", {"oldPath": None, "newPath": "/x"}),
    ("knowledge.fs.cat", {"path": "/knowledge", "limit": [1]}),
]


@pytest.mark.parametrize(("name", "args"), BAD)
def test_bad_types_are_service_errors(space, name, args):
    with pytest.raises(ServiceError):
        tools.call(tools.BY_NAME[name], space, args)
