"""The node's bus path imports no array library: an MLX node never loads torch just to move frames."""

from __future__ import annotations

import subprocess
import sys

import pytest

NODE_MODULES = (
    "mohawk_shard.node.wire",
    "mohawk_shard.node.worker",
    "mohawk_shard.node.head",
    "mohawk_shard.node.service",
)


@pytest.mark.parametrize("module", NODE_MODULES)
def test_importing_the_node_loads_neither_torch_nor_transformers(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "print(','.join(m for m in ('torch', 'transformers', 'mlx') if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    assert loaded == "", f"importing {module} loaded {loaded}"
