"""KV memory a sliding-window model's sequence holds with per-group block tables, against every layer
keeping every block: `.venv/bin/python -m bench.kv_window_savings` (arithmetic of
`mohawk_common.kv_groups`, the rule the block manager and the planner use; shapes from the models'
published configs, 16-token blocks, an 8,192-token sequence)."""

from __future__ import annotations

from mohawk_common.kv_groups import blocks_per_sequence, group_of_layer, kv_groups, page_layers

BLOCK_SIZE = 16
CONTEXT = 8192
SHAPES: dict[str, list[int | None]] = {
    "Mistral-7B-v0.1 (32 layers, all window 4096)": [4096] * 32,
    "Gemma-2-9B (42 layers, alternating, window 4096)": [4096 if i % 2 == 0 else None for i in range(42)],
    "Gemma-3-27B (62 layers, 5 local : 1 global, window 1024)": [
        None if (i + 1) % 6 == 0 else 1024 for i in range(62)
    ],
}


def main() -> None:
    for name, windows in SHAPES.items():
        groups = kv_groups(windows)
        page = page_layers(group_of_layer(groups, len(windows)), 0, len(windows))
        held = blocks_per_sequence(groups, CONTEXT, BLOCK_SIZE) * page
        before = -(-CONTEXT // BLOCK_SIZE) * len(windows)
        print(f"{name}: {len(groups)} KV groups, {held} layer-blocks vs {before}: {held / before:.2f}x")


if __name__ == "__main__":
    main()
