"""Float32 data on the wire: embeddings, scores and probabilities travel as little-endian
float32 bytes, row-major (``count x dims``, ``count``, ``count x len(labels)``)."""

from __future__ import annotations

import numpy as np

from serving.protocol.codes import ProtocolError


def embeddings_to_bytes(matrix: np.ndarray) -> tuple[int, int, bytes]:
    """Return ``(count, dims, little-endian float32 row-major bytes)`` of a 2-D matrix."""
    if matrix.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D matrix, got shape {matrix.shape}")
    data = np.ascontiguousarray(matrix, dtype="<f4").tobytes()
    return int(matrix.shape[0]), int(matrix.shape[1]), data


def embeddings_from_bytes(data: bytes, count: int, dims: int) -> np.ndarray:
    """Inverse of :func:`embeddings_to_bytes`; checks the byte length against the shape."""
    return floats_from_bytes(data, count, dims)


def floats_to_bytes(values: np.ndarray) -> bytes:
    """Little-endian float32 bytes of a vector or a row-major matrix."""
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def floats_from_bytes(data: bytes, rows: int, columns: int) -> np.ndarray:
    """A ``rows x columns`` float32 matrix from little-endian bytes (length checked)."""
    if rows < 0 or columns < 0 or len(data) != rows * columns * 4:
        raise ProtocolError(f"{len(data)} bytes do not hold {rows} x {columns} float32")
    return np.frombuffer(data, dtype="<f4").reshape(rows, columns).astype(np.float32)
