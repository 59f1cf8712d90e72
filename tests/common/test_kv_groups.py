"""KV groups: how layers are grouped by attention type, and the block arithmetic of a window."""

from __future__ import annotations

from mohawk_common.kv_groups import (
    KVGroup,
    blocks_per_sequence,
    group_of_layer,
    kv_groups,
    max_tokens_in,
    page_layers,
    tensor_slots,
)


def test_one_attention_type_is_one_group() -> None:
    assert kv_groups([None] * 4) == (KVGroup((0, 1, 2, 3), None),)
    assert kv_groups([5] * 3) == (KVGroup((0, 1, 2), 5),)


def test_alternating_layers_form_two_equal_groups() -> None:
    groups = kv_groups([6, None, 6, None])  # Gemma 2: sliding, global, sliding, global
    assert groups == (KVGroup((1, 3), None), KVGroup((0, 2), 6))
    owner = group_of_layer(groups, 4)
    assert owner == [1, 0, 1, 0]
    assert page_layers(owner, 0, 4) == 2 and page_layers(owner, 0, 2) == 1
    assert tensor_slots(owner, 0, 4) == [0, 0, 1, 1]


def test_five_to_one_splits_the_sliding_layers_round_robin() -> None:
    windows: list[int | None] = [5 if (i + 1) % 6 else None for i in range(12)]  # Gemma 3
    groups = kv_groups(windows)
    assert groups[0] == KVGroup((5, 11), None)
    assert [g.layers for g in groups[1:]] == [(0, 6), (1, 7), (2, 8), (3, 9), (4, 10)]
    owner = group_of_layer(groups, 12)
    assert page_layers(owner, 0, 12) == 2 and page_layers(owner, 0, 6) == 1


def test_a_sliding_group_holds_its_window_only() -> None:
    group = KVGroup((0,), window=5)
    assert group.first_needed_block(4, 4) == 0  # keys 0..4
    assert group.first_needed_block(8, 4) == 1  # keys 4..8
    assert group.first_needed_block(12, 4) == 2
    assert group.max_blocks(3, 4) == 1
    assert group.max_blocks(100, 4) == 2  # 5 keys over at most 2 blocks of 4
    assert group.max_blocks(100, 4, chunk=8) == 4
    assert KVGroup((0,)).max_blocks(100, 4) == 25


def test_context_that_fits_a_pool() -> None:
    full, sliding = KVGroup((0,)), KVGroup((1,), 5)
    assert blocks_per_sequence((full, sliding), 40, 4) == 10 + 2
    assert max_tokens_in((full,), 10, 4, 1000) == 40
    assert max_tokens_in((full, sliding), 12, 4, 1000) == 40
    assert max_tokens_in((sliding,), 3, 4, 1000) == 1000  # a window never outgrows its blocks
