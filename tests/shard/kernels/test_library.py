"""The compiled kernels library: built on first use, chosen off by a setting, and torch's own
kernels where it cannot be built, saying why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mohawk_shard.kernels import library

pytestmark = pytest.mark.skipif(library.kernel() is None, reason="the kernels do not build here")


def kernel_in_a_process(**env: str) -> subprocess.CompletedProcess[str]:
    code = "from mohawk_shard.kernels import library; print(library.kernel() is not None)"
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def test_built_once_into_the_kernel_folder_then_loaded(tmp_path: Path) -> None:
    built = kernel_in_a_process(MOHAWK_KERNEL_DIR=str(tmp_path))
    assert built.stdout.strip().endswith("True"), built.stderr
    assert "built the CPU kernels" in built.stdout + built.stderr
    (path,) = tmp_path.glob("mohawk_kernels-*.so")
    again = kernel_in_a_process(MOHAWK_KERNEL_DIR=str(tmp_path), CXX="no-such-compiler")
    assert again.stdout.strip().endswith("True"), again.stderr  # no compiler needed any more
    assert "built the CPU kernels" not in again.stdout + again.stderr
    assert list(tmp_path.glob("*.so")) == [path]  # no temporary left


def test_off_by_setting_and_without_a_compiler_torchs_kernels(tmp_path: Path) -> None:
    chosen = kernel_in_a_process(MOHAWK_CPU_KERNELS="off")
    assert chosen.stdout.strip().endswith("False"), chosen.stderr
    assert "MOHAWK_CPU_KERNELS=off" in chosen.stdout + chosen.stderr
    nothing = kernel_in_a_process(MOHAWK_KERNEL_DIR=str(tmp_path), CXX="no-such-compiler")
    assert nothing.stdout.strip().endswith("False"), nothing.stderr
    assert "no C++ compiler" in nothing.stdout + nothing.stderr
    wrong = kernel_in_a_process(MOHAWK_CPU_KERNELS="fast")
    assert wrong.returncode != 0 and "auto or off" in wrong.stderr


def test_prebuild_makes_every_instruction_sets_build() -> None:
    """In the process's kernel folder, where its own build and the tests' `isa_builds` lie already
    (each build takes about ten seconds on CI's two cores): prebuild adds the rest (a compiler
    builds each whatever the CPU) and hands back every one."""
    built = library.prebuild(library.library_dir())
    assert [p.name.split("-")[1] for p in built] == [isa.lower() for isa in library.ISA_FLAGS]
    assert all(p.is_file() for p in built)
