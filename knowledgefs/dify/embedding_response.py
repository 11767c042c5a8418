"""Validation of Dify's embedding answers: one batch's ``{"embeddings": [[…], …]}`` checked
(count, one dimension, JSON numbers only, finite) and the batches of one call joined and
L2-normalised to float32. Every defect is :class:`ModelRuntimeError` (``invalid`` or
``dimension``) naming the route."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import ModelRuntimeError


def embeddings(data: Any, count: int, route: str, expected_dimension: int | None) -> np.ndarray:
    """Validate one batch's ``{"embeddings": [[…], …]}`` and return it as float32."""
    rows = data.get("embeddings") if isinstance(data, dict) else None
    if not isinstance(rows, list) or len(rows) != count:
        got = len(rows) if isinstance(rows, list) else "no"
        raise ModelRuntimeError.of(
            "invalid", f"{route}: {got} embeddings for {count} inputs", route=route
        )
    if not rows or not all(isinstance(row, list) for row in rows):
        raise ModelRuntimeError.of("invalid", f"{route}: an embedding is not a list", route=route)
    dimensions = {len(row) for row in rows}
    if len(dimensions) != 1:
        raise ModelRuntimeError.of(
            "dimension",
            f"{route}: one batch holds vectors of dimensions {sorted(dimensions)}",
            route=route,
        )
    dimension = dimensions.pop()
    if dimension == 0:
        raise ModelRuntimeError.of("invalid", f"{route}: empty vectors", route=route)
    if expected_dimension is not None and dimension != expected_dimension:
        raise ModelRuntimeError.of(
            "dimension",
            f"{route}: the model returned {dimension}-d vectors, {expected_dimension}-d expected",
            route=route,
        )
    # JSON numbers only: numpy would turn "0.5", "1e0" or true into numbers.
    if not all(type(v) is float or type(v) is int for row in rows for v in row):
        raise ModelRuntimeError.of(
            "invalid", f"{route}: an embedding holds a value that is not a number", route=route
        )
    try:
        matrix = np.array(rows, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise ModelRuntimeError.of(
            "invalid", f"{route}: an embedding holds a non-number", route=route
        ) from None
    if matrix.ndim != 2 or not np.isfinite(matrix).all():
        raise ModelRuntimeError.of(
            "invalid", f"{route}: an embedding holds a non-finite value", route=route
        )
    return matrix


def stacked(parts: list[np.ndarray], expected: int | None, route: str) -> np.ndarray:
    """Join batches (all of one dimension) and L2-normalise each row to float32."""
    dimensions = sorted({part.shape[1] for part in parts})
    if len(dimensions) != 1:
        raise ModelRuntimeError.of(
            "dimension",
            f"{route}: batches of one call returned dimensions {dimensions}",
            route=route,
        )
    matrix = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ModelRuntimeError.of("invalid", f"{route}: a zero vector was returned", route=route)
    normalised: np.ndarray = (matrix / norms).astype(np.float32)
    return normalised
