"""Fixed-order attention: each query's bits alone against any call it shares (a prompt chunk, other
sequences, padded keys, thread count, instruction set, a trace), and the softmax it should be."""

from __future__ import annotations

from ctypes import CDLL

import numpy as np
import pytest
import torch

from mohawk_shard.kernels import attend_rows
from mohawk_shard.kernels.library import kernel
from mohawk_shard.model.fixed_chunk_attention import allowed_keys

pytestmark = pytest.mark.skipif(kernel() is None, reason="the compiled kernels do not build here")

HEADS, KV_HEADS, DIM = 9, 3, 64
SCALE = DIM**-0.5


def additive(allowed: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.where(allowed, 0.0, -np.inf).astype(np.float32))


def sequence(length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sequence's queries [length, H, D] and keys/values [KVH, length, D]."""
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(length, HEADS, DIM, generator=gen),
        torch.randn(KV_HEADS, length, DIM, generator=gen),
        torch.randn(KV_HEADS, length, DIM, generator=gen),
    )


def run(
    seqs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    queries: list[range],
    padded: int,
    window: int | None = None,
    build: CDLL | None = None,
) -> list[torch.Tensor]:
    """Attention of `queries[i]` (positions) of each sequence i, in one call, over `padded` keys a
    sequence, which sit in a cache pool at scattered slots (as a paged cache's blocks do)."""
    num_q = max(len(r) for r in queries)
    q = torch.zeros(len(seqs), num_q, HEADS, DIM)
    num_slots = len(seqs) * padded + 17
    slots = torch.randperm(num_slots, generator=torch.Generator().manual_seed(99))[: len(seqs) * padded]
    slots = slots.view(len(seqs), padded)
    k = torch.randn(KV_HEADS, num_slots, DIM)  # slots no sequence uses hold other keys
    v = torch.randn(KV_HEADS, num_slots, DIM)
    for i, ((sq, sk, sv), rows) in enumerate(zip(seqs, queries, strict=True)):
        q[i, : len(rows)] = sq[rows.start : rows.stop]
        k[:, slots[i, : rows.stop]], v[:, slots[i, : rows.stop]] = sk[:, : rows.stop], sv[:, : rows.stop]
    query_lens = np.array([len(r) for r in queries])
    context_lens = np.array([r.stop for r in queries])
    mask = additive(allowed_keys(query_lens, context_lens, window, padded))
    if build is None:
        out = attend_rows.attend(q, k, v, slots, mask, SCALE)
    else:  # that build's own C function (only the process's build is the op)
        out = torch.empty(len(seqs), num_q, HEADS * DIM)
        build.mohawk_attend_rows(
            q.data_ptr(), len(seqs), num_q, HEADS, DIM, k.data_ptr(), v.data_ptr(), KV_HEADS, padded,
            *k.stride()[:2], slots.data_ptr(), mask.data_ptr(), SCALE, out.data_ptr(), 2,
        )  # fmt: skip
    return [out[i, : len(rows)] for i, rows in enumerate(queries)]


def reference(
    seq: tuple[torch.Tensor, torch.Tensor, torch.Tensor], pos: int, window: int | None
) -> torch.Tensor:
    """float64 softmax attention of the query at `pos` -> [H·D]."""
    q, k, v = (t.double() for t in seq)
    first = 0 if window is None else max(0, pos - window + 1)
    keys = k[:, first : pos + 1].repeat_interleave(HEADS // KV_HEADS, dim=0)  # [H, n, D]
    values = v[:, first : pos + 1].repeat_interleave(HEADS // KV_HEADS, dim=0)
    weights = torch.softmax(torch.einsum("hd,hnd->hn", q[pos] * SCALE, keys), dim=-1)
    return torch.einsum("hn,hnd->hd", weights, values).reshape(-1)


@pytest.mark.parametrize("window", [None, 24])
def test_the_softmax_it_should_be(window: int | None) -> None:
    seq = sequence(100, seed=1)
    (out,) = run([seq], [range(0, 100)], padded=128, window=window)
    for pos in (0, 1, 23, 24, 57, 99):
        torch.testing.assert_close(out[pos].double(), reference(seq, pos, window), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 24])
def test_a_querys_bits_do_not_depend_on_its_call(window: int | None) -> None:
    seqs = [sequence(n, seed=10 + n) for n in (70, 130, 33)]
    # every query of sequence 1 as a decode alone (keys padded to 64 past it), then the whole
    # prompt in one chunk, in other chunks, and beside other sequences' prompts and decodes
    alone = torch.cat(
        [run([seqs[1]], [range(p, p + 1)], padded=p + 64, window=window)[0] for p in range(130)]
    )
    (prompt,) = run([seqs[1]], [range(0, 130)], padded=192, window=window)
    assert torch.equal(prompt, alone)
    chunks = [
        run([seqs[1]], [range(a, b)], padded=b, window=window)[0] for a, b in ((0, 7), (7, 64), (64, 130))
    ]
    assert torch.equal(torch.cat(chunks), alone)
    mixed = run(seqs, [range(69, 70), range(40, 130), range(0, 33)], padded=256, window=window)
    assert torch.equal(mixed[1], alone[40:130])
    # one decode step of sequences of different lengths: each reads only the key blocks it sees
    positions = (69, 129, 5)
    decodes = run(seqs, [range(p, p + 1) for p in positions], padded=256, window=window)
    for seq, pos, out in zip(seqs, positions, decodes, strict=True):
        assert torch.equal(out, run([seq], [range(pos, pos + 1)], padded=pos + 1, window=window)[0])
    assert torch.equal(decodes[1], alone[129:130])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(run([seqs[1]], [range(0, 130)], padded=130, window=window)[0], alone)
    finally:
        torch.set_num_threads(threads)


def test_every_instruction_sets_build_gives_the_same_bits(isa_builds: dict[str, CDLL]) -> None:
    seq = sequence(90, seed=3)
    first, *others = (run([seq], [range(0, 90)], padded=128, build=build)[0] for build in isa_builds.values())
    assert all(torch.equal(first, other) for other in others), list(isa_builds)


@pytest.mark.parametrize("dim", [DIM, 72])  # 72: a head dimension past whole chunks of 64 and blocks of 16
def test_fp16_keys_and_values_give_the_bits_of_their_widened_copy(dim: int) -> None:
    """A cache stored fp16 (the CPU default) attends as an fp32 cache holding the same numbers."""
    gen = torch.Generator().manual_seed(6)
    half_k, half_v = (torch.randn(KV_HEADS, 300, dim, generator=gen).half() for _ in range(2))
    slots = torch.randperm(300, generator=gen)[:160].view(2, 80)
    for lens in ((1, 1), (7, 30)):  # decodes; prompt chunks beside each other
        q = torch.randn(2, max(lens), HEADS, dim, generator=gen)
        mask = additive(allowed_keys(np.array(lens), np.array([70, 45]), None, 80))
        widened = attend_rows.attend(q, half_k.float(), half_v.float(), slots, mask, dim**-0.5)
        assert torch.equal(attend_rows.attend(q, half_k, half_v, slots, mask, dim**-0.5), widened)
    with pytest.raises(ValueError, match="both float32 or both float16"):
        attend_rows.attend(q, half_k, half_v.float(), slots, mask, dim**-0.5)


def test_every_instruction_sets_build_reads_fp16_alike(isa_builds: dict[str, CDLL]) -> None:
    seq = sequence(90, seed=7)
    k, v = (t.half() for t in seq[1:])
    q = seq[0].unsqueeze(0)
    mask = additive(allowed_keys(np.array([90]), np.array([90]), None, 96))
    slots = torch.arange(96).clamp_max(89).view(1, 96)
    outs = []
    for build in isa_builds.values():
        out = torch.empty(1, 90, HEADS * DIM)
        build.mohawk_attend_rows_f16(
            q.data_ptr(), 1, 90, HEADS, DIM, k.data_ptr(), v.data_ptr(), KV_HEADS, 96, *k.stride()[:2],
            slots.data_ptr(), mask.data_ptr(), SCALE, out.data_ptr(), 2,
        )  # fmt: skip
        outs.append(out)
    assert all(torch.equal(outs[0], other) for other in outs[1:]), list(isa_builds)
    assert torch.equal(outs[0], attend_rows.attend(q, k.float(), v.float(), slots, mask, SCALE))


def test_a_trace_records_one_call_with_the_same_bits() -> None:
    seq = sequence(40, seed=4)
    mask = additive(allowed_keys(np.array([1]), np.array([40]), None, 64))
    keys = torch.zeros(KV_HEADS, 64, DIM)
    keys[:, :40] = seq[1]
    slots = torch.arange(64).view(1, 64)

    class Step(torch.nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            return attend_rows.attend(q, keys, keys, slots, mask, SCALE) + 1

    q = seq[0][39:40].unsqueeze(0)
    traced = torch.jit.trace(Step(), (q,), check_trace=False)
    assert "mohawk::attend_rows" in str(traced.graph)
    other = seq[0][12:13].unsqueeze(0)
    assert torch.equal(traced(other), Step()(other))


def test_mismatched_shapes_and_slots_outside_the_pool_are_refused() -> None:
    q, keys, slots = (
        torch.zeros(2, 1, HEADS, DIM),
        torch.zeros(KV_HEADS, 64, DIM),
        torch.zeros(2, 64, dtype=torch.long),
    )
    with pytest.raises(ValueError, match="against keys"):
        attend_rows.attend(q, keys[:, :, :32], keys[:, :, :32], slots, torch.zeros(2, 1, 64), SCALE)
    with pytest.raises(ValueError, match="mask"):
        attend_rows.attend(q, keys, keys, slots, torch.zeros(2, 1, 32), SCALE)
    with pytest.raises(ValueError, match="int64 slots"):
        attend_rows.attend(q, keys, keys, slots[:1], torch.zeros(2, 1, 64), SCALE)
    with pytest.raises(ValueError, match="slot 64 outside the pool of 64"):
        attend_rows.attend(q, keys, keys, slots + 64, torch.zeros(2, 1, 64), SCALE)


def test_keys_are_read_in_place_from_a_strided_pool() -> None:
    """A slot-major cache viewed head-major (strided, not contiguous) gives the bits of a gathered,
    contiguous copy of the same keys."""
    gen = torch.Generator().manual_seed(5)
    pool_k, pool_v = (torch.randn(300, KV_HEADS, DIM, generator=gen).transpose(0, 1) for _ in range(2))
    assert not pool_k.is_contiguous()
    slots = torch.randperm(300, generator=gen)[:128].view(1, 128)
    q = torch.randn(1, 3, HEADS, DIM, generator=gen)
    mask = additive(allowed_keys(np.array([3]), np.array([100]), None, 128))
    in_place = attend_rows.attend(q, pool_k, pool_v, slots, mask, SCALE)
    gathered_k, gathered_v = (pool[:, slots[0]].contiguous() for pool in (pool_k, pool_v))
    in_order = torch.arange(128).view(1, 128)
    assert torch.equal(in_place, attend_rows.attend(q, gathered_k, gathered_v, in_order, mask, SCALE))


def test_no_queries_give_no_rows() -> None:
    keys, slots = torch.zeros(KV_HEADS, 64, DIM), torch.zeros(1, 64, dtype=torch.long)
    out = attend_rows.attend(torch.zeros(1, 0, HEADS, DIM), keys, keys, slots, torch.zeros(1, 0, 64), SCALE)
    assert out.shape == (1, 0, HEADS * DIM)
