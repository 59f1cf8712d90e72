"""Matmuls over GGUF's 5-, 6- and 8-bit codes as stored: `GroupwiseLinear` and `ConcatLinear`.

Design. Q5_0, Q5_1, Q5_K, Q6_K and Q8_0 have no torch kernel: tinygemm takes 4-bit codes in
groups of 32 or more (Q6_K's groups are 16), and `_weight_int8pack_mm` one scale per output row,
so either would mean requantizing the file's weights. `GroupwiseLinear` holds the codes as int8
(one byte a weight) with the file's fp32 scales (and minimums) per group, and for each call unpacks
`UNPACK_ELEMENTS` weights at a time, `scale · code + minimum` in the activations' dtype, into one
reused buffer that stays in cache, multiplying each slice of output rows as it goes: the weights
are exactly the file's, and no dense copy outlives the call. Printed by `python
bench/kquant_kernels.py --runs 15` (torch 2.13, 1 thread, this project's 2-core AMD EPYC with AVX2
and no native bf16, load average 7–8 from other work; median (fastest) of one 5632 × 2048 call):
batch 1 takes 13.9 (9.1) ms in groups of 16 and 16.5 (8.0) ms in groups of 32 with minimums,
against 5.1 (3.6) ms dense fp32, 2.1 (1.9) ms for the 4-bit kernel (Q4_K), 8.5 (4.4) ms for a 5-
or 8-bit code split into two 4-bit kernels (`lo + 16·hi`, groups of 32 only) and 102 (81) ms
unpacking the whole matrix at once (its fresh 46 MB buffer is faulted in every call); 512 rows
take 232–235 ms against 337 ms dense fp32, 440 ms for the 4-bit kernel and 934 ms for the split
pair. Held here (the torch path: CUDA, or a CPU without the compiled kernels, which hold Q6_K in
6 bits, `kernels/int8_rows.py`): 1.07 bytes a weight (Q6_K: its stored int8 scale per 16 and fp16
per 256, multiplied out a slice at a time), 1.125 (Q5_0, Q8_0: an fp32 scale per 32) or 1.25
(Q5_1/Q5_K: scale and minimum per 32) against 4 for dense fp32 and the file's 0.69 (Q5_x) to 1.06
(Q8_0). So decode pays two to three times a dense fp32 matmul on these tensors
(five at SmolLM2's 1536 × 576) for under a third of the memory, and prefill 0.7–1.4 times; in a
Q4_K_M file they are the minority (attn_v and ffn_down of some layers, the LM head). On a GPU,
bf16 rows of up to `groupwise_triton.MAX_ROWS` go through a Triton kernel that forms the weights in
registers instead (`groupwise_triton.py`; on an H200, Q6_K at batch 1 0.051 ms against 0.093
unpacked), and longer calls unpack as above. `ConcatLinear` runs a fused matmul whose parts the
file stores in different formats (q/k Q4_K with v Q6_K): each run of parts sharing a format is one
module, and the outputs are concatenated, so every part is held at its own format rather than the
widest. A tied model's table (Q4_K_M makes it Q6_K when there is no output.weight) is held once:
`SharedTableEmbedding` looks rows up in the head's codes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mohawk_common.model_store.quantized import GroupQuantized
from mohawk_shard.kernels import int8_rows
from mohawk_shard.model import groupwise_triton
from mohawk_shard.model.quantized_layers import GroupwiseEmbedding

UNPACK_ELEMENTS = 1 << 18  # weights unpacked at a time on CPU: 1 MiB of fp32, which stays in L2
# on a GPU: 32 MiB of bf16, so a large head's call never holds a dense copy of it
UNPACK_ELEMENTS_GPU = 1 << 24


class GroupwiseLinear(nn.Module):
    """y = x·Wᵀ (+ b), W = scales · codes + mins per group: on CPU, where the compiled kernels run,
    the file's codes in `int8_rows`' layout through integer dot products (`kernel_weight`); elsewhere (and
    with `kernel="torch"`) int8 codes unpacked a slice at a time. Scales and minimums are fp16
    where they fit (the file's own are: Q5_K's `d·sc` is rounded), so both paths hold the same
    weights."""

    codes: torch.Tensor
    scales: torch.Tensor | None
    sub_scales: torch.Tensor | None
    super_scales: torch.Tensor | None
    mins: torch.Tensor | None

    def __init__(
        self,
        weight: GroupQuantized | int8_rows.PackedInt8,
        device: torch.device,
        bias: torch.Tensor | None = None,
        kernel: str = "auto",
        source_format: str = "",
    ):
        """`weight`: the codes, or a weight already in the kernel's layout (the loader's repack from
        the file's blocks, `kernels/repack.py`), whose GGUF type is `source_format`."""
        super().__init__()
        self.bias = nn.Parameter(bias.to(device), requires_grad=False) if bias is not None else None
        self.triton = False
        self.kernel_weight: int8_rows.PackedInt8 | None = None
        if isinstance(weight, int8_rows.PackedInt8):
            self.out_features, self.in_features = weight.out_features, weight.in_features
            factored = weight.subs is not None
            self.group_size = int8_rows.SUB_GROUP if factored else int8_rows.GROUP_SIZE
            self.source_format, self.groups_per_super = (
                source_format,
                int8_rows.SUPER_BLOCK // self.group_size,
            )
            self._hold_kernel_weight(weight)
            return
        signed = weight.codes.dtype == np.int8
        if weight.bits > (8 if signed else 7):
            raise ValueError(f"{weight.bits}-bit unsigned codes do not fit int8")
        self.out_features, self.in_features = weight.shape
        self.group_size = weight.group_size
        self.source_format = weight.source_format
        self.groups_per_super = weight.super_block // weight.group_size
        if kernel != "torch" and int8_rows.supports(weight, device):
            self._hold_kernel_weight(int8_rows.pack(weight, device))
            return
        codes = np.ascontiguousarray(weight.codes).view(np.int8)  # unsigned codes below 128 keep their value
        self.register_buffer("codes", torch.from_numpy(codes).to(device))
        # Q6_K's scales as stored (int8 a group, fp16 a super-block: 1.07 bytes a weight with the
        # codes), multiplied out a slice at a time; else the tables in fp16 where they fit
        factors = weight.scale_factors
        tables = [weight.scales] if weight.mins is None else [weight.scales, weight.mins]
        table_dtype = torch.float16 if int8_rows.fits_fp16(*tables) else torch.float32
        scales = None if factors is not None else torch.from_numpy(weight.scales).to(device, table_dtype)
        self.register_buffer("scales", scales)
        self.register_buffer(
            "sub_scales", None if factors is None else torch.from_numpy(factors[0]).to(device)
        )
        self.register_buffer(
            "super_scales", None if factors is None else torch.from_numpy(factors[1]).to(device)
        )
        mins = None if weight.mins is None else torch.from_numpy(weight.mins).to(device, table_dtype)
        self.register_buffer("mins", mins)
        elements = UNPACK_ELEMENTS if device.type == "cpu" else UNPACK_ELEMENTS_GPU
        self.chunk_rows = max(1, elements // self.in_features)
        # on a GPU, bf16/fp16 rows through the Triton kernel: the codes as held, no unpacked copy
        self.triton = device.type == "cuda" and kernel != "torch" and groupwise_triton.available()

    def _hold_kernel_weight(self, packed: int8_rows.PackedInt8) -> None:
        self.kernel_weight = packed
        for name in ("codes", "scales", "mins", "subs"):  # buffers, so the module's bytes count them
            self.register_buffer(f"row_{name}", getattr(packed, name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if self.kernel_weight is not None:
            y = int8_rows.matmul(flat.float(), self.kernel_weight).to(x.dtype)
        elif (
            self.triton
            and flat.dtype in groupwise_triton.DTYPES
            and flat.shape[0] <= groupwise_triton.MAX_ROWS
        ):
            y = self._triton_matmul(flat)
        else:
            y = self._unpacked_matmul(flat)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def _triton_matmul(self, flat: torch.Tensor) -> torch.Tensor:
        scales, supers = (
            (self.scales, None) if self.scales is not None else (self.sub_scales, self.super_scales)
        )
        if scales is None:
            raise RuntimeError("a groupwise layer holds neither scales nor scale factors")
        group, per_super = self.group_size, self.groups_per_super
        return groupwise_triton.groupwise_matmul(
            flat, self.codes, scales, group, self.mins, supers, group * per_super
        )

    def _unpacked_matmul(self, flat: torch.Tensor) -> torch.Tensor:
        """flat [M, in] through the codes unpacked `chunk_rows` output rows at a time -> [M, out]."""
        groups = self.in_features // self.group_size
        chunk = min(self.chunk_rows, self.out_features)
        buffer = torch.empty(chunk, groups, self.group_size, dtype=flat.dtype, device=flat.device)
        out_t = torch.empty(self.out_features, flat.shape[0], dtype=flat.dtype, device=flat.device)
        codes = self.codes.view(self.out_features, groups, self.group_size)
        scales = self.group_scales(slice(None)).unsqueeze(-1)  # Q6_K's multiplied out once a call
        mins = None if self.mins is None else self.mins.float()
        for first in range(0, self.out_features, chunk):
            last = min(first + chunk, self.out_features)
            weight = buffer[: last - first]
            # a copy then an in-place product: 2.6x faster than one mixed-dtype `torch.mul(out=)`
            weight.copy_(codes[first:last]).mul_(scales[first:last])
            if mins is not None:
                weight.add_(mins[first:last, :, None])
            torch.mm(weight.view(last - first, self.in_features), flat.t(), out=out_t[first:last])
        return out_t.t().contiguous()

    def dense_weight(self) -> torch.Tensor:
        """The fp32 weight [out, in] this layer multiplies by (for tests and checks)."""
        return self.row_weights(torch.arange(self.out_features, device=self._device()))

    def row_weights(self, rows: torch.Tensor) -> torch.Tensor:
        """fp32 weights [n, in] of output `rows` (int64 [n]): a tied table's embedding lookup."""
        if self.kernel_weight is not None:
            return int8_rows.row_weights(self.kernel_weight, rows)
        groups = self.codes.index_select(0, rows).float().view(rows.shape[0], -1, self.group_size)
        out = groups * group_scales(self, rows).unsqueeze(-1)
        if self.mins is not None:
            out = out + self.mins.index_select(0, rows).float().unsqueeze(-1)
        return out.view(rows.shape[0], self.in_features)

    def _device(self) -> torch.device:
        return (self.kernel_weight.codes if self.kernel_weight is not None else self.codes).device

    def group_scales(self, rows: slice | torch.Tensor) -> torch.Tensor:
        """fp32 scales [rows, groups] of output `rows` (a slice or indices)."""
        return group_scales(self, rows)

    def extra_repr(self) -> str:
        shape = f"in={self.in_features}, out={self.out_features}, group={self.group_size}"
        held = "int8_rows kernel" if self.kernel_weight is not None else "int8 codes"
        held += ", Triton" if self.triton else ""
        return f"{shape} ({self.source_format}, {held})"


def group_scales(layer: GroupwiseLinear, rows: slice | torch.Tensor) -> torch.Tensor:
    """fp32 scales [rows, groups] of a layer holding either fp32 `scales` or Q6_K's factors."""
    if layer.scales is not None:
        return layer.scales[rows].float()
    if layer.sub_scales is None or layer.super_scales is None:
        raise RuntimeError("a groupwise layer holds neither scales nor scale factors")
    sub_scales, super_scales = layer.sub_scales[rows], layer.super_scales[rows]
    by_super = sub_scales.view(sub_scales.shape[0], -1, layer.groups_per_super).float()
    return (by_super * super_scales.float().unsqueeze(-1)).view(sub_scales.shape)


class ConcatLinear(nn.Module):
    """A fused matmul held as parts in their own formats: y = [part₁(x), part₂(x), …] (+ b)."""

    def __init__(self, parts: list[nn.Module], bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.source_format = " + ".join(str(getattr(p, "source_format", "?")) for p in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([part(x) for part in self.parts], dim=-1)
        return y if self.bias is None else y + self.bias.to(y.dtype)


class SharedTableEmbedding(GroupwiseEmbedding):
    """A tied token table looked up in its LM head's own codes, scales and minimums: one copy."""

    def __init__(self, head: GroupwiseLinear, dtype: torch.dtype) -> None:
        nn.Module.__init__(self)  # the buffers are the head's, not built from a table
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features
        self.group_size, self.dtype, self.packed = head.group_size, dtype, False
        self.source_format = f"{head.source_format}, the head's codes"
        self.head = [head]  # a list: not a submodule, so its buffers are counted once, in the head

    def rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        weights = self.head[0].row_weights(token_ids.reshape(-1))
        return weights.view(*token_ids.shape, self.embedding_dim)
