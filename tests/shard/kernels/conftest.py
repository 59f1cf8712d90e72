"""Every build of the kernels library this CPU runs, for tests that compare their bits."""

from __future__ import annotations

from ctypes import CDLL

import pytest

from mohawk_shard.kernels import library


@pytest.fixture(scope="session")
def isa_builds() -> dict[str, CDLL]:
    isas = library.runnable_isas()
    if len(isas) < 2 or library.kernel() is None:
        pytest.skip("needs a CPU that runs the AVX2 and the AVX-512 builds, and a compiler")
    # the process's own kernel folder: its widest build is there already (each build takes about
    # ten seconds on CI's two cores); the others are named by their own digests beside it
    folder = library.library_dir()
    return {isa: library.load_library(library.build_library(isa, folder)) for isa in isas}
