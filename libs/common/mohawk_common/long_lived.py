"""Keeping what a process built at start-up out of the cycle collector's full collections.

Design. CPython's cycle collector walks every tracked object of the oldest generation on a full
collection, and one comes whenever enough objects have survived the younger ones, at whatever
allocation happens to tip it. In a shard node that walk covers the imports (torch alone brings
tens of thousands of functions, classes and dicts), the tokenizer and the model's metadata, none
of which ever becomes garbage: it took 115 ms, measured with `gc.callbacks` in the chaos test of
a killed stage, and it landed on the failover's critical path (building the new stage 0's
`BlockManager`, 4,369 `Block`s, tipped it) and holds the GIL, so the event loop stalls with it.
`gc.freeze()` moves every object tracked now into a permanent generation the collector never
walks. A process calls `freeze_long_lived` once, when its start-up is done: it collects first, so
only what is alive is frozen, and from then on a full collection walks only what was made since
(stages, requests, steps). What is frozen is still freed by reference counting; only a reference
cycle among frozen objects would stay, and start-up's objects live as long as the process.
"""

from __future__ import annotations

import gc


def freeze_long_lived() -> int:
    """Collect, then move every object tracked now out of the collector's reach; how many moved."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
