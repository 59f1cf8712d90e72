"""`Sequence`: the one object that crosses the engine's layers (engine, scheduler, block manager)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mohawk_shard.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """A request's tokens and its progress through the KV cache.

    `num_computed_tokens` counts tokens whose KV has been scheduled for computation; it runs ahead
    of the pipeline, so a sequence whose every token is computed is waiting for its next sampled
    token and is not scheduled again until that token is appended.
    """

    seq_id: int
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    num_prompt_tokens: int = -1
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_preemptions: int = 0

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 0:
            self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """True when only the latest sampled token is left to compute."""
        return self.num_uncomputed_tokens == 1 and self.num_computed_tokens >= self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
