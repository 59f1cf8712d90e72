"""The split Q8_0 head: one copy of the table, exact rows, exact logits on its shortlist."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mohawk_common.model_store import ModelSource
from mohawk_common.model_store.quantized import GroupQuantized, StoredBlocks
from mohawk_shard.backends import make_backend
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.model.split_head import SplitHeadEmbedding, SplitQ8Head, split_head_fits


def q8_0_table(rows: int, columns: int, seed: int) -> GroupQuantized:
    """A table as GGUF stores Q8_0: int8 codes in [-127, 127], an fp16 scale per 32."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(-127, 128, size=(rows, columns), dtype=np.int8)
    scales = rng.uniform(0.001, 0.02, size=(rows, columns // 32)).astype(np.float16).astype(np.float32)
    return GroupQuantized(codes, scales, None, 8, 32, "Q8_0")


def q8_0_blocks(table: GroupQuantized) -> np.ndarray:
    """The table's rows as GGUF lays Q8_0 out: each group an fp16 scale, then its 32 int8 codes."""
    rows, columns = table.shape
    groups = columns // 32
    raw = np.empty((rows, groups, 34), dtype=np.uint8)
    raw[:, :, :2] = table.scales.astype(np.float16).view(np.uint8).reshape(rows, groups, 2)
    raw[:, :, 2:] = table.codes.view(np.uint8).reshape(rows, groups, 32)
    return raw.reshape(rows, groups * 34)


@pytest.fixture(scope="module")
def head() -> tuple[SplitQ8Head, GroupQuantized]:
    table = q8_0_table(640, 96, seed=1)
    if not split_head_fits(table, torch.device("cpu")):
        pytest.skip("this CPU's int4 packing is not one the split head reads")
    return SplitQ8Head.from_table(table, torch.device("cpu"), shortlist=32), table


def test_rows_are_the_files_exact_weights(head: tuple[SplitQ8Head, GroupQuantized]) -> None:
    split, table = head
    ids = torch.tensor([[0, 63, 64, 65], [639, 320, 31, 32]])
    expected = torch.from_numpy(table.dequantize())[ids]
    assert torch.equal(split.rows(ids), expected)
    embedding = SplitHeadEmbedding(split, torch.float32)
    assert torch.equal(embedding(ids), expected)


def test_logits_are_exact_on_the_shortlist_and_greedy_keeps_the_best(
    head: tuple[SplitQ8Head, GroupQuantized],
) -> None:
    split, table = head
    x = torch.randn(5, 96)
    reference = x @ torch.from_numpy(table.dequantize()).t()
    logits = split(x)
    top = reference.topk(4, dim=-1).indices
    torch.testing.assert_close(logits.gather(-1, top), reference.gather(-1, top), atol=1e-4, rtol=1e-5)
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))
    # the ranking pass alone is the high nibbles, within 7.5 scale steps a weight of the file's
    approximate = split.approximate(x).float()
    bound = (x.abs() @ torch.from_numpy(np.repeat(table.scales, 32, axis=1)).t()) * 7.5 * 1.05 + 0.05
    assert ((approximate - reference).abs() <= bound).all()


def test_bundled_stage_holds_the_table_once(bundled: ModelSource) -> None:
    whole = make_backend("torch", bundled, 0, bundled.config.num_layers, device="cpu", weights="native")
    assert isinstance(whole, TorchBackend)
    model = whole.model
    if not isinstance(model.lm_head, SplitQ8Head):
        pytest.skip("this CPU's int4 packing is not one the split head reads")
    assert isinstance(model.embed_tokens, SplitHeadEmbedding) and model.embed_tokens.head is model.lm_head
    table = bundled.read_quantized("embed_tokens.weight")
    assert table is not None
    ids = torch.tensor([1, 2, 4000, 49151])
    assert torch.equal(model.embed_tokens(ids), torch.from_numpy(table.dequantize())[ids])


def test_a_rows_logits_do_not_depend_on_the_other_rows(head: tuple[SplitQ8Head, GroupQuantized]) -> None:
    """Bit for bit the same logits for a row alone and among 31 others (the rescoring was a batched
    matmul, whose result for one row moved by up to 3e-5 with the number of rows)."""
    split, _ = head
    x = torch.randn(32, 96, generator=torch.Generator().manual_seed(3))
    together = split(x)
    alone = torch.cat([split(x[i : i + 1]) for i in range(32)])
    assert torch.equal(together, alone)


@pytest.mark.parametrize("permuted", [False, True], ids=["rows-in-order", "rows-picked"])
def test_the_compiled_split_from_blocks_holds_the_same_bits(permuted: bool) -> None:
    """`from_blocks` (one threaded pass over the file's blocks) builds every buffer `from_table`
    builds from the decoded codes, bit for bit, with an outsized scale and an all -128 group in."""
    table = q8_0_table(320, 128, seed=2)
    table.codes[5, :32] = -128
    table.scales[7, 1] = 500.0  # (7.5 - 128)·d = -60250: still fits fp16
    rows = np.random.default_rng(4).permutation(320) if permuted else None
    raw = q8_0_blocks(table)
    picked = (
        table if rows is None else GroupQuantized(table.codes[rows], table.scales[rows], None, 8, 32, "Q8_0")
    )
    cpu = torch.device("cpu")
    split = SplitQ8Head.from_blocks(StoredBlocks(raw, "Q8_0", (320, 128), rows), cpu)
    if split is None:
        pytest.skip("no compiled kernels on this CPU")
    reference = SplitQ8Head.from_table(picked, cpu)
    ours, theirs = dict(split.named_buffers()), dict(reference.named_buffers())
    assert ours.keys() == theirs.keys()
    for name, buffer in theirs.items():
        assert torch.equal(ours[name], buffer), name
    ids = torch.tensor([0, 5, 7, 319])
    assert torch.equal(split.rows(ids), torch.from_numpy(picked.dequantize())[ids])


def test_a_scale_past_fp16_keeps_the_numpy_path() -> None:
    table = q8_0_table(32, 64, seed=5)
    table.scales[3, 0] = 600.0  # (7.5 - 128)·d = -72300: past fp16
    assert (
        SplitQ8Head.from_blocks(StoredBlocks(q8_0_blocks(table), "Q8_0", (32, 64)), torch.device("cpu"))
        is None
    )
