"""How long a process takes to open a GGUF file's config and tokenizer, cold and with the metadata
cache (`model_store/gguf_cache.py`) warm: each run a fresh process, as a node or gateway starts.

usage: python bench/gguf_open.py [FILE] [--runs N]   (default: the bundled model, 3 runs each)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = """
import json, sys, time
from pathlib import Path
started = time.perf_counter()
from mohawk_common.model_store import open_model
source = open_model(Path(sys.argv[1]) if sys.argv[1] else None)
opened = time.perf_counter()
source.load_tokenizer()
print(json.dumps({"config_s": opened - started, "tokenizer_s": time.perf_counter() - opened}))
"""


def _one(path: str, cache: Path) -> dict[str, float]:
    env = {**os.environ, "MOHAWK_CACHE_DIR": str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, path], env=env, capture_output=True, text=True, check=True
    ).stdout
    return dict(json.loads(out.splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", default="")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    cold: list[dict[str, float]] = []
    warm: list[dict[str, float]] = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as cache:
            cold.append(_one(args.file, Path(cache)))  # an empty cache: transformers reads the file
            warm.append(_one(args.file, Path(cache)))  # the entry the cold run kept
    for name, runs in (("cold", cold), ("warm", warm)):
        for key in ("config_s", "tokenizer_s"):
            values = [r[key] for r in runs]
            print(
                f"{name} {key.removesuffix('_s')}: median {statistics.median(values):.2f} s "
                f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} runs)"
            )


if __name__ == "__main__":
    main()
