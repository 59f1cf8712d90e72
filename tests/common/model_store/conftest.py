"""Shared fixtures of the model store tests: the bundled model, opened once per session."""

from __future__ import annotations

import pytest

from mohawk_common.model_store import ModelSource, open_model


@pytest.fixture(scope="session")
def bundled() -> ModelSource:
    """The bundled SmolLM2-135M-Instruct Q4_1 GGUF (opening it reads its config, ~5 s)."""
    return open_model()
