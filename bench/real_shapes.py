"""Random-weight GGUFs of real models' shapes, quantized by llama.cpp's own quantizer, for speed runs
at the sizes users bring (nothing is downloaded: the weights are random, the tokenizer and chat
template the bundled SmolLM2's).

Speed does not depend on weight values when generation runs a fixed number of tokens, so figures
taken on these files compare with the real ones'; their text is noise. Each file is written once
as F16 (random normal weights, std 0.02; norms 1) and quantized with `llama_cpp.llama_model_quantize`
(the `bench` extra) to the types asked for, the F16 deleted after; all cached under
`~/.cache/mohawk/bench-models` (`MOHAWK_BENCH_MODELS` to move it), never in the repository. A
shape whose vocabulary is wider than SmolLM2's 49,152 pads the token list with ordinary tokens, as a
real vocabulary of that size is ordinary pieces with a few thousand special ones (files written
before `WRITER` 2 padded it with user-defined tokens, which every tokenizer holds as added tokens:
213k of them took `tokenizers` 2.0 s to read against 0.7 s as ordinary pieces).
Gemma 3 270M's shape is a `gemma3` file as llama.cpp's converter writes one (q/k norms, norms after
attention and MLP, a 512-token sliding window on five layers of six, 256-wide heads, its 262,144
tokens: the table is most of its weights). Qwen3-30B-A3B's shape is a `qwen3moe` file at a
reduced depth (4 of its 48 layers: 128 experts of 768, 8 routed a token, q/k norms), which is what
a MoE's speed turns on; its bytes are those of 4 such layers, not of the 30B file.

usage: python bench/real_shapes.py [--shape smollm2-1.7b] [--types Q4_K_M,Q6_K]   (prints the paths)
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mohawk_common.model_store.store import bundled_model_path


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    rope_theta: float
    arch: str = "llama"
    head_dim: int | None = None  # None: hidden / heads
    sliding_window: int | None = None
    experts: int = 0  # routed experts a layer (0: a dense MLP of `intermediate`)
    experts_used: int = 0


SHAPES = {
    "gemma-3-270m": Shape(18, 640, 2048, 4, 1, 262144, True, 1000000.0, "gemma3", 256, 512),
    "qwen3-30b-a3b-4l": Shape(4, 2048, 768, 32, 4, 151936, False, 1000000.0, "qwen3moe", 128, None, 128, 8),
    "smollm2-1.7b": Shape(24, 2048, 8192, 32, 32, 49152, True, 130000.0),
    "llama-3.2-3b": Shape(28, 3072, 8192, 24, 8, 128256, True, 500000.0),
    "llama-3.1-8b": Shape(32, 4096, 14336, 32, 8, 128256, False, 500000.0),
}
# llama.cpp's file types (llama.h's LLAMA_FTYPE_MOSTLY_*)
FILE_TYPES = {"Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "Q8_0": 7}


def cache_dir() -> Path:
    configured = os.environ.get("MOHAWK_BENCH_MODELS")
    return Path(configured) if configured else Path.home() / ".cache" / "mohawk" / "bench-models"


WRITER = 2  # in the cached files' names: a file an older writer wrote is written again


def cached_name(shape_name: str, type_name: str) -> str:
    return f"{shape_name}-random{WRITER}-{type_name}.gguf"


def model_file(shape_name: str, type_name: str) -> Path:
    """The quantized file of `shape_name` in `type_name`, written now where it is not cached."""
    path = cache_dir() / cached_name(shape_name, type_name)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    f16 = cache_dir() / cached_name(shape_name, "F16")
    if not f16.is_file():
        write_f16(f16, SHAPES[shape_name])
    quantize(f16, path, FILE_TYPES[type_name])
    return path


def write_f16(path: Path, shape: Shape) -> None:
    import gguf

    started = time.perf_counter()
    source = gguf.GGUFReader(bundled_model_path())
    temporary = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(temporary), shape.arch)
    writer.add_name(f"random-{path.stem}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab)
    head_dim = shape.head_dim or shape.hidden // shape.heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if shape.arch == "llama":
        writer.add_rope_dimension_count(head_dim)
    if shape.sliding_window is not None:
        writer.add_sliding_window(shape.sliding_window)
    if shape.experts:
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
        writer.add_expert_feed_forward_length(shape.intermediate)
    writer.add_file_type(1)  # F16
    _copy_tokenizer(writer, source, shape.vocab)
    # tensors are named first and made one at a time as they are written: an 8B's 16 GB of F16
    # never sits in memory at once (the same random draws, in the same order, as making them all)
    rng = np.random.default_rng(0)
    tensors: list[tuple[str, tuple[int, ...], type]] = []

    def matrix(name: str, *dims: int) -> None:
        tensors.append((name, dims, np.float16))

    def ones(name: str, width: int = shape.hidden) -> None:  # Gemma's files store 1 + w: w = 0 there
        tensors.append((name, (width,), np.float32))

    matrix("token_embd.weight", shape.vocab, shape.hidden)
    ones("output_norm.weight")
    if not shape.tied:
        matrix("output.weight", shape.vocab, shape.hidden)
    for layer in range(shape.layers):
        prefix = f"blk.{layer}."
        ones(prefix + "attn_norm.weight")
        matrix(prefix + "attn_q.weight", shape.heads * head_dim, shape.hidden)
        matrix(prefix + "attn_k.weight", shape.kv_heads * head_dim, shape.hidden)
        matrix(prefix + "attn_v.weight", shape.kv_heads * head_dim, shape.hidden)
        matrix(prefix + "attn_output.weight", shape.hidden, shape.heads * head_dim)
        ones(prefix + "ffn_norm.weight")
        if shape.experts:  # llama.cpp's stacked experts: [experts, out, in]
            matrix(prefix + "ffn_gate_inp.weight", shape.experts, shape.hidden)
            for part in ("ffn_gate_exps", "ffn_up_exps"):
                matrix(prefix + part + ".weight", shape.experts, shape.intermediate, shape.hidden)
            matrix(prefix + "ffn_down_exps.weight", shape.experts, shape.hidden, shape.intermediate)
        else:
            matrix(prefix + "ffn_gate.weight", shape.intermediate, shape.hidden)
            matrix(prefix + "ffn_up.weight", shape.intermediate, shape.hidden)
            matrix(prefix + "ffn_down.weight", shape.hidden, shape.intermediate)
        if shape.arch in ("gemma3", "qwen3moe"):
            ones(prefix + "attn_q_norm.weight", head_dim)
            ones(prefix + "attn_k_norm.weight", head_dim)
        if shape.arch == "gemma3":
            ones(prefix + "post_attention_norm.weight")
            ones(prefix + "post_ffw_norm.weight")
    for name, dims, dtype in tensors:
        writer.add_tensor_info(name, dims, np.dtype(dtype), int(np.prod(dims)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, dims, dtype in tensors:
        if dtype is np.float32:
            writer.write_tensor_data(np.ones(dims, dtype=np.float32))
        else:
            writer.write_tensor_data((rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16))
    writer.close()
    temporary.rename(path)
    print(f"wrote {path} in {time.perf_counter() - started:.0f} s", flush=True)


def _copy_tokenizer(writer: object, source: object, vocab: int) -> None:
    """The bundled file's tokenizer and chat template, its token list padded to `vocab`."""
    import gguf

    fields = source.fields  # type: ignore[attr-defined]
    for key, field in fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        main_type = field.types[0]
        sub_type = field.types[1] if len(field.types) > 1 else None
        if key == "tokenizer.ggml.tokens":
            value = [*value, *(f"<|reserved_{i}|>" for i in range(vocab - len(value)))]
        elif key == "tokenizer.ggml.token_type":
            value = [*value, *([gguf.TokenType.NORMAL] * (vocab - len(value)))]
        writer.add_key_value(key, value, main_type, sub_type)  # type: ignore[attr-defined]


def quantize(source: Path, target: Path, file_type: int, num_threads: int | None = None) -> None:
    """llama.cpp's own quantizer: `source` (an F16/F32 GGUF) to `target` as `file_type` (llama.h's
    LLAMA_FTYPE_MOSTLY_*), written beside it and renamed into place."""
    import ctypes

    import llama_cpp

    started = time.perf_counter()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = file_type, num_threads or os.cpu_count() or 1
    temporary = target.with_suffix(".partial")
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(temporary).encode(), ctypes.byref(params)
    )
    if status != 0:
        raise RuntimeError(f"llama_model_quantize failed ({status}) on {source}")
    temporary.rename(target)
    print(f"quantized {target} in {time.perf_counter() - started:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-1.7b")
    parser.add_argument("--types", default="Q4_K_M", help=f"comma-separated, of {', '.join(FILE_TYPES)}")
    parser.add_argument("--keep-f16", action="store_true", help="keep the F16 file for more types later")
    args = parser.parse_args()
    for type_name in args.types.split(","):
        print(model_file(args.shape, type_name))
    f16 = cache_dir() / cached_name(args.shape, "F16")
    if not args.keep_f16 and f16.exists():
        f16.unlink()


if __name__ == "__main__":
    main()
