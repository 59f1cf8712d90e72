"""The compiled CPU kernels (`*.cpp` beside this file) as one library: built on first use, its
kernels registered as torch ops.

Design. The kernels are plain C++ with a C ABI; one more file, `ops.cpp`, wraps them as torch ops
against torch's own headers (the wheel ships them), so the library builds in a few seconds with
the machine's g++ (or `CXX`) into `MOHAWK_KERNEL_DIR` (default `~/.cache/mohawk/kernels`), under a
name that digests the sources, the flags and torch's version: an edit, another flag or another
torch builds a new file, and processes starting together each compile to a temporary file and
rename it into place. It is built for the widest instruction set torch itself uses on this CPU
(`torch.backends.cpu.get_cpu_capability()`: AVX2 or AVX512), and for AVX512_VNNI where an AVX512
CPU also lists `avx512_vnni` (the 4-bit kernel's integer dot products); each kernel computes the
same bits in every build. It links OpenMP, which resolves to the libgomp torch already loaded: one
thread pool, sized by `torch.get_num_threads()` at each call. Where the CPU is not x86 with AVX2,
no compiler is found, the build fails or `MOHAWK_CPU_KERNELS=off` is set, `kernel()` is None and
the layers keep torch's own kernels (tinygemm for 4-bit matmuls, fixed-chunk attention as torch
ops); the log says why, once. An image without a compiler ships the builds `prebuild` made (the
Dockerfile does).

The process's build registers `torch.ops.mohawk.*` (`mohawk_register_ops`, once): eager code and
traced decode steps call the kernels through the dispatcher, with no Python between (a ctypes call
and its wrapper cost about 8 µs, more than most of a decode step's kernels take). Other builds can
be loaded beside it, unregistered, and called through their C functions (the tests compare the
AVX2 and AVX-512 builds' bits that way).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import structlog
import torch

from mohawk_common.env_knobs import env_knob

log = structlog.get_logger("mohawk.shard.kernels")

SOURCES = tuple(sorted(Path(__file__).parent.glob("*.cpp")))
HEADERS = tuple(sorted(Path(__file__).parent.glob("*.h")))  # included by the sources: in the digest
FLAGS = ("-O3", "-std=c++20", "-fopenmp", "-fPIC", "-shared", "-ffp-contract=off", "-Wl,-Bsymbolic")
_AVX2 = ("-mavx2", "-mfma", "-mf16c")
_AVX512 = (*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl")
ISA_FLAGS = {  # a build (torch's CPU capability, or AVX512 with VNNI) -> its instruction set flags
    "AVX2": _AVX2,
    "AVX512": _AVX512,
    "AVX512_VNNI": (*_AVX512, "-mavx512vnni"),
}
INT4_LAYOUT_VERSION = 2  # what int4_rows.pack lays out; the library must answer the same
BUILD_TIMEOUT_S = 300.0
CHOICE_ENV = env_knob(
    "MOHAWK_CPU_KERNELS",
    "auto",
    "auto: Mohawk's CPU kernels where they build (g++); off: never (torch's own)",
)
DIR_ENV = env_knob(
    "MOHAWK_KERNEL_DIR",
    "~/.cache/mohawk/kernels",
    "where the CPU kernels are built and found (one per CPU feature set)",
)

_POINTER, _SIZE = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "mohawk_int4_rows_mm": [
        _POINTER, _SIZE, _SIZE, _POINTER, _POINTER, _POINTER, _SIZE, _POINTER, ctypes.c_int,
    ],
    "mohawk_q4k_rows_mm": [
        _POINTER, _SIZE, _SIZE, _POINTER, _POINTER, _POINTER, _SIZE, _POINTER, ctypes.c_int,
    ],
    "mohawk_int8_rows_mm": [
        _POINTER, _SIZE, _SIZE, _POINTER, _POINTER, _POINTER, _POINTER, ctypes.c_int32, _SIZE, _POINTER,
        ctypes.c_int,
    ],
    "mohawk_repack_blocks": [
        _POINTER, _SIZE, _POINTER, _SIZE, _SIZE, ctypes.c_int, ctypes.c_int, _POINTER, _POINTER, _POINTER,
        _POINTER, ctypes.c_int,
    ],
    "mohawk_split_q8_blocks": [
        _POINTER, _SIZE, _POINTER, _SIZE, _SIZE, _POINTER, _POINTER, _POINTER, _POINTER, _POINTER,
        ctypes.c_int,
    ],
    "mohawk_top_rows": [_POINTER, _SIZE, _SIZE, _SIZE, _POINTER, ctypes.c_int],
    "mohawk_rms_norm_rows": [_POINTER, _SIZE, _SIZE, _POINTER, ctypes.c_float, _POINTER, ctypes.c_int],
    "mohawk_attend_rows": [
        _POINTER, _SIZE, _SIZE, _SIZE, _SIZE, _POINTER, _POINTER, _SIZE, _SIZE, _SIZE, _SIZE,
        _POINTER, _POINTER, ctypes.c_float, _POINTER, ctypes.c_int,
    ],
    "mohawk_attend_rows_f16": [
        _POINTER, _SIZE, _SIZE, _SIZE, _SIZE, _POINTER, _POINTER, _SIZE, _SIZE, _SIZE, _SIZE,
        _POINTER, _POINTER, ctypes.c_float, _POINTER, ctypes.c_int,
    ],
}  # fmt: skip


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The loaded library, or None (why is logged once) where this process keeps torch's kernels."""
    choice = os.environ.get(CHOICE_ENV, "auto")
    if choice not in ("auto", "off"):
        raise ValueError(f"{CHOICE_ENV}={choice!r}: auto or off")
    reason = _unavailable(choice)
    if reason is None:
        try:
            library = load_library(build_library(runnable_isas()[-1], library_dir()))
            if library.mohawk_register_ops() != 0:
                raise RuntimeError("registering the kernels as torch ops failed")
            return library
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            reason = f"could not build or load the CPU kernels: {str(exc)[-500:]}"
    log.info("compiled CPU kernels off: torch's own kernels", reason=reason)
    return None


def require() -> ctypes.CDLL:
    """The loaded library; a caller that got here without checking `kernel()` first is a bug."""
    library = kernel()
    if library is None:
        raise RuntimeError("the compiled CPU kernels are not available here")
    return library


def _unavailable(choice: str) -> str | None:
    if choice == "off":
        return f"{CHOICE_ENV}=off"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the kernels are x86 code; this is {platform.machine()}"
    isas = runnable_isas()
    if not isas:
        return f"the kernels need AVX2 and FMA; torch reports {torch.backends.cpu.get_cpu_capability()}"
    if _compiler() is None and not library_path(isas[-1], library_dir()).is_file():
        return "no C++ compiler (g++, or CXX) to build the kernels"
    return None


def runnable_isas() -> list[str]:
    """The builds (keys of ISA_FLAGS) this CPU runs, widest last; empty where it runs none."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ISA_FLAGS:
        return []
    if capability == "AVX2":
        return ["AVX2"]
    return ["AVX2", "AVX512", *(["AVX512_VNNI"] if "avx512_vnni" in _cpu_flags() else [])]


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The flags Linux lists for this CPU (none where /proc/cpuinfo cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


def library_dir() -> Path:
    configured = os.environ.get(DIR_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "mohawk" / "kernels"


def torch_flags() -> tuple[str, ...]:
    """What `ops.cpp` compiles and links with: this torch's headers and libraries, its C++ ABI."""
    root = Path(torch.__file__).parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return (
        f"-I{root / 'include'}",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-L{root / 'lib'}",
        f"-Wl,-rpath,{root / 'lib'}",
        "-ltorch_cpu",
        "-lc10",
    )


def library_path(isa: str, directory: Path) -> Path:
    """Where the build for `isa` (a key of ISA_FLAGS) of these sources, flags and torch lives."""
    flags = (*FLAGS, *ISA_FLAGS[isa], *torch_flags(), torch.__version__)
    digest = hashlib.sha256(b"".join(s.read_bytes() for s in (*SOURCES, *HEADERS)) + " ".join(flags).encode())
    return directory / f"mohawk_kernels-{isa.lower()}-{digest.hexdigest()[:16]}.so"


def build_library(isa: str, directory: Path) -> Path:
    """The library for `isa`, built now where it is not there yet: each source compiled on a core
    of its own (the sources were one compiler run, which kept one of CI's two cores idle), then
    linked into a temporary file renamed into place."""
    path = library_path(isa, directory)
    if path.is_file():
        return path
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=path.stem + "-", suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory(prefix=path.stem + "-", dir=path.parent) as objects:
            compile_flags = (*FLAGS, *ISA_FLAGS[isa], *torch_flags())
            outputs = [str(Path(objects) / f"{source.stem}.o") for source in SOURCES]
            commands = [
                [compiler, *compile_flags, "-c", str(source), "-o", output]
                for source, output in zip(SOURCES, outputs, strict=True)
            ]
            workers = min(len(commands), os.cpu_count() or 1)
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(lambda command: _run_compiler(command, compiler), commands))
            link = [compiler, *FLAGS, *ISA_FLAGS[isa], *outputs, "-o", temporary, *torch_flags()]
            _run_compiler(link, compiler)
        os.replace(temporary, path)  # atomic: a process starting beside us loads a whole file
        log.info("built the CPU kernels", path=str(path))
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path


def _run_compiler(command: list[str], compiler: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(done.stderr or f"{compiler} exited {done.returncode}")


def prebuild(directory: Path) -> list[Path]:
    """Every instruction set's build in `directory` (an image's builder stage: the runtime image has
    no compiler and finds them through MOHAWK_KERNEL_DIR); a compiler builds each whatever the CPU."""
    return [build_library(isa, directory) for isa in ISA_FLAGS]


def load_library(path: Path) -> ctypes.CDLL:
    library = ctypes.CDLL(str(path))
    library.mohawk_int4_rows_version.restype = ctypes.c_int
    if library.mohawk_int4_rows_version() != INT4_LAYOUT_VERSION:
        raise RuntimeError(f"{path} lays weights out as version {library.mohawk_int4_rows_version()}")
    for name, arguments in _SIGNATURES.items():
        function = getattr(library, name)
        function.restype, function.argtypes = None, arguments
    library.mohawk_int8_rows_mm.restype = ctypes.c_int  # 0, or -1 for tables no format has
    library.mohawk_repack_blocks.restype = ctypes.c_int  # 0, -1 (not this layout's type), -2 (past fp16)
    library.mohawk_split_q8_blocks.restype = ctypes.c_int
    library.mohawk_register_ops.restype, library.mohawk_register_ops.argtypes = ctypes.c_int, []
    return library
