"""Fixtures of the fault suite: models whose replies are wide, and a fleet per module."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def wide_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer random BERT with MiniLM's width (384 dims): replies as large as MiniLM's."""
    return build_tiny_model(tmp_path_factory.mktemp("wide-384"), hidden=384, layers=1, heads=2)


@pytest.fixture(scope="session")
def wider_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1024 dims: a 2048-input reply is 8 MiB of float32."""
    return build_tiny_model(tmp_path_factory.mktemp("wide-1024"), hidden=1024, layers=1, heads=2)
