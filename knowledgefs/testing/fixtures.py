"""Shared fixtures: a tenant, a space, an API client with a real key, object storage in tmp."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pytest_django.fixtures import Settings
from rest_framework.test import APIClient

from knowledgefs.auth.principal import Principal

if TYPE_CHECKING:
    from rest_framework.response import _MonkeyPatchedResponse

    from spaces.models import KnowledgeSpace

SHARED = Path(__file__).resolve().parents[2].parent / "shared"


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test when the folder is not beside the checkout."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is not present (../shared exists only beside CI and dev checkouts)")
    return path


@pytest.fixture(autouse=True)
def integrated_mode(settings: Settings) -> None:
    """The Workspace provisioning and cutover routes are on in tests (the deployment default is
    off: ``KNOWLEDGE_INTEGRATED_MODE_ENABLED``); a test of the switch turns it off."""
    settings.KNOWLEDGE_INTEGRATED_MODE_ENABLED = True


@pytest.fixture(autouse=True)
def object_storage(settings: Settings, tmp_path: Path) -> Path:
    """Each test writes objects into its own temporary folder."""
    root = tmp_path / "objects"
    settings.STORAGES = {
        **settings.STORAGES,
        "objects": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(root)},
        },
    }
    return root


@pytest.fixture(autouse=True)
def var_dir(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test keeps its derived files under ``KNOWLEDGE_VAR_DIR`` (the SQLite keyword
    indexes, ``search/keyword/``) in its own temporary folder; the database stays where the
    settings put it. Processes the test starts with ``knowledgefs.testing.cluster_settings``
    (gunicorn, qcluster) read the same folder from ``KFS_TEST_VAR_DIR``."""
    var = tmp_path / "var"
    settings.VAR_DIR = var
    var.mkdir()
    monkeypatch.setenv("KFS_TEST_VAR_DIR", str(var))
    return var


@pytest.fixture
def tenant() -> str:
    return "tenant-a"


@pytest.fixture
def principal(tenant: str) -> Principal:
    return Principal(tenant_id=tenant)


@pytest.fixture
def space(db: None, principal: Principal) -> KnowledgeSpace:
    from spaces.services import create_space

    return create_space(principal, name="Test space")


@pytest.fixture
def api_key(db: None, tenant: str) -> str:
    from spaces.api_keys import create_api_key

    return create_api_key(tenant)[1]


@pytest.fixture
def client(api_key: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key}")
    return api


def multipart_body(filename: str, data: bytes, field: str = "file") -> tuple[bytes, str]:
    """Encode one file part the way browsers do (HTML5: UTF-8 name, quote as %22).

    Django's test client would apply ``os.path.basename`` to the name; real clients do not.
    """
    boundary = "kfs-test-boundary-7MA4YWxkTrZu0gW"
    name = filename.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")
    head = (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="{field}"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    body = head + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def upload(
    client: APIClient, space: KnowledgeSpace, filename: str, data: bytes, **params: Any
) -> _MonkeyPatchedResponse:
    """POST a multipart upload with ``filename`` exactly as given."""
    query = "&".join(f"{k}={v}" for k, v in params.items())
    url = f"/v1/knowledge-spaces/{space.id}/documents" + (f"?{query}" if query else "")
    body, content_type = multipart_body(filename, data)
    # Django takes bytes as the body; the stubs say str only.
    return client.generic("POST", url, body, content_type=content_type)  # type: ignore[arg-type]


def compile_all() -> int:
    """Compile every queued job in this process (the worker's code path, without the queue)."""
    from ingestion.compilation.recovery import drain_queued

    return drain_queued()
