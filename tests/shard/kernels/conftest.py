"""Every build of the kernels library this CPU runs, for tests that compare their bits."""

from __future__ import annotations

from ctypes import CDLL
from pathlib import Path

import pytest

from mohawk_shard.kernels import library


@pytest.fixture(scope="session")
def isa_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CDLL]:
    isas = library.runnable_isas()
    if len(isas) < 2 or library.kernel() is None:
        pytest.skip("needs a CPU that runs the AVX2 and the AVX-512 builds, and a compiler")
    folder = Path(tmp_path_factory.mktemp("kernels"))
    return {isa: library.load_library(library.build_library(isa, folder)) for isa in isas}
