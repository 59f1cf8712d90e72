"""Both instruction sets' builds of the kernels library, for tests that compare their bits."""

from __future__ import annotations

from ctypes import CDLL
from pathlib import Path

import pytest
import torch

from mohawk_shard.kernels import library


@pytest.fixture(scope="session")
def isa_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CDLL]:
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or library.kernel() is None:
        pytest.skip("needs a CPU that runs both the AVX2 and the AVX-512 build, and a compiler")
    folder = Path(tmp_path_factory.mktemp("kernels"))
    return {isa: library.load_library(library.build_library(isa, folder)) for isa in library.ISA_FLAGS}
