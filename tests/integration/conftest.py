"""Fixtures shared by the cluster tests."""

from __future__ import annotations

import pytest

from tests.integration.cluster_helpers import reference_texts


@pytest.fixture(scope="session")
def reference() -> dict[str, str]:
    """The single-process engine's greedy texts, computed once for every cluster test module."""
    return reference_texts()
