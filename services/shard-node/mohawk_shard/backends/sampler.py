"""Batch token sampler of the last pipeline stage.

Design. `Sampler.sample` turns one step's logits [B, V] into one token per row, treating the batch
as a whole in float32: penalties (counts from one scatter_add over the rows that use them), then
min_tokens suppression of eos/stop tokens, then greedy rows take the argmax. Random rows are divided
by their temperature, cut to top-k (one topk over the rows that ask) and top-p (one topk of the 256
best probabilities over the rows that ask; a full sort only for a row whose nucleus is wider), and
drawn with the Gumbel-max trick: argmax(logits / T - log E), E = -log U ~ Exp(1). A seeded row
draws U from a generator seeded with hash(seed, tokens generated so far), so token i of a seeded
request depends only on (seed, i, its own logits): never on batch size, position or preemption.
Which steps a row goes through depends only on its own parameters and logits, for the same reason.
When every row is plain greedy, one argmax and one `.tolist()` do the whole batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.sampling_params import SamplingParams

_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_TINY = torch.finfo(torch.float32).tiny
# Top-p looks for its cut among this many best tokens before it sorts a whole row.
_TOP_P_CANDIDATES = 256


def _splitmix64(value: int) -> int:
    z = (value + _GOLDEN_GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def step_seed(seed: int, step: int) -> int:
    """The 63-bit generator seed for output token `step` of a request seeded with `seed`."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ step) >> 1


def _mask_top_k(x: torch.Tensor, ks: torch.Tensor) -> torch.Tensor:
    """Keep each row's `k` best logits (and any tied with the k-th); the rest become -inf."""
    kth = x.topk(int(ks.max()), dim=-1).values.gather(1, (ks - 1)[:, None])
    return x.masked_fill(x < kth, -math.inf)


def _nucleus_size(sorted_probs: torch.Tensor, ps: torch.Tensor) -> torch.Tensor:
    """[n, 1] count of best tokens needed to reach mass p (the first token is always needed)."""
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    return (mass_before < ps[:, None]).sum(dim=-1, keepdim=True).clamp_min_(1)  # NaN rows: 1


def _mask_top_p(x: torch.Tensor, ps: torch.Tensor) -> torch.Tensor:
    """Keep each row's smallest set of best tokens whose probability reaches p (ties at the cut kept).

    The cut is looked for among the `_TOP_P_CANDIDATES` best tokens (a topk); only rows whose
    nucleus reaches past them pay for a full sort.
    """
    vocab = x.shape[1]
    probs = x.softmax(dim=-1)
    best = probs.topk(min(_TOP_P_CANDIDATES, vocab), dim=-1).values
    num_keep = _nucleus_size(best, ps)
    floor = best.gather(1, num_keep - 1)
    if best.shape[1] < vocab:
        wide = (num_keep.squeeze(1) == best.shape[1]).nonzero().squeeze(1)
        if wide.numel():
            full = probs[wide].sort(dim=-1, descending=True).values
            floor[wide] = full.gather(1, _nucleus_size(full, ps[wide]) - 1)
    return x.masked_fill(probs < floor, -math.inf)


@dataclass(frozen=True, slots=True)
class SamplingRow:
    """One row of a sampling batch: its parameters and the tokens it has generated so far.

    `output_token_ids` feeds the penalties and min_tokens, and its length is the index of the
    random stream a seeded row draws from.
    """

    params: SamplingParams
    output_token_ids: Sequence[int]


def _is_plain_greedy(row: SamplingRow) -> bool:
    p = row.params
    return (
        p.is_greedy
        and p.logprobs is None
        and p.presence_penalty == 0.0
        and p.frequency_penalty == 0.0
        and len(row.output_token_ids) >= p.min_tokens
    )


class Sampler:
    """Samples one token per row from a batch of logits; see the module docstring."""

    def __init__(self, eos_token_ids: Sequence[int]) -> None:
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self._shared: dict[torch.device, torch.Generator] = {}
        self._seeded: dict[torch.device, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> list[SampledToken]:
        """One `SampledToken` per row of `logits` [B, V] (any float dtype, any device)."""
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits of shape {tuple(logits.shape)} do not match {len(rows)} rows")
        if not rows:
            return []
        if all(_is_plain_greedy(row) for row in rows):
            return [SampledToken(t) for t in logits.argmax(dim=-1).tolist()]
        return self._sample_batch(logits, rows)

    def _sample_batch(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> list[SampledToken]:
        raw = logits.float()
        x = torch.nan_to_num(raw, nan=-math.inf, posinf=math.inf, neginf=-math.inf)  # a copy
        self._apply_penalties(x, rows)
        self._suppress_stop_tokens(x, rows)
        random_rows = [i for i, row in enumerate(rows) if not row.params.is_greedy]
        if len(random_rows) == len(rows):
            tokens = self._sample_random(x, rows)
        else:
            tokens = x.argmax(dim=-1)
            if random_rows:
                index = torch.tensor(random_rows, device=x.device)
                tokens[index] = self._sample_random(x[index], [rows[i] for i in random_rows])
        # A row left with nothing finite (all -inf/NaN) falls back to the raw argmax.
        chosen = x.gather(1, tokens[:, None]).squeeze(1)
        tokens = torch.where(chosen == -math.inf, raw.argmax(dim=-1), tokens)
        return self._outputs(raw, tokens, rows)

    def _apply_penalties(self, x: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
        """logits[t] -= frequency * count(t) + presence * (count(t) > 0), over output tokens."""
        picked = [
            i
            for i, row in enumerate(rows)
            if (row.params.presence_penalty or row.params.frequency_penalty) and row.output_token_ids
        ]
        if not picked:
            return
        vocab = x.shape[1]
        width = max(len(rows[i].output_token_ids) for i in picked)
        padded = [
            [*rows[i].output_token_ids, *[vocab] * (width - len(rows[i].output_token_ids))] for i in picked
        ]
        ids = torch.tensor(padded, dtype=torch.long, device=x.device)
        ids.masked_fill_((ids < 0) | (ids > vocab), vocab)  # column `vocab` is dropped below
        counts = torch.zeros(len(picked), vocab + 1, device=x.device)
        counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))
        counts = counts[:, :vocab]
        frequency = torch.tensor([rows[i].params.frequency_penalty for i in picked], device=x.device)
        presence = torch.tensor([rows[i].params.presence_penalty for i in picked], device=x.device)
        index = torch.tensor(picked, device=x.device)
        x[index] -= frequency[:, None] * counts + presence[:, None] * (counts > 0).float()

    def _suppress_stop_tokens(self, x: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
        """Before min_tokens outputs, eos and the request's stop_token_ids cannot be sampled."""
        vocab = x.shape[1]
        row_index: list[int] = []
        token_index: list[int] = []
        for i, row in enumerate(rows):
            if len(row.output_token_ids) < row.params.min_tokens:
                for token in (*self.eos_token_ids, *row.params.stop_token_ids):
                    if 0 <= token < vocab:
                        row_index.append(i)
                        token_index.append(token)
        if row_index:
            x[
                torch.tensor(row_index, device=x.device), torch.tensor(token_index, device=x.device)
            ] = -math.inf

    def _sample_random(self, x: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """Temperature, top-k, top-p, then a Gumbel-max draw; `x` holds only random rows."""
        device, vocab = x.device, x.shape[1]
        params = [row.params for row in rows]
        x = x / torch.tensor([p.temperature for p in params], device=device)[:, None]
        top_k_rows = [j for j, p in enumerate(params) if 0 < p.top_k < vocab]
        if top_k_rows:
            index = torch.tensor(top_k_rows, device=device)
            ks = torch.tensor([params[j].top_k for j in top_k_rows], device=device)
            x[index] = _mask_top_k(x[index], ks)
        top_p_rows = [j for j, p in enumerate(params) if p.top_p < 1.0]
        if top_p_rows:
            index = torch.tensor(top_p_rows, device=device)
            ps = torch.tensor([params[j].top_p for j in top_p_rows], device=device)
            x[index] = _mask_top_p(x[index], ps)
        # Gumbel-max: argmax(x - log E), E = -log U ~ Exp(1); U = 0 gives E = inf, a token that loses.
        exponential = self._uniform_noise(rows, vocab, device).log_().neg_().clamp_min_(_TINY)
        return (x - exponential.log_()).argmax(dim=-1)

    def _uniform_noise(self, rows: Sequence[SamplingRow], vocab: int, device: torch.device) -> torch.Tensor:
        """U[0, 1) noise [len(rows), V]: per-(seed, step) streams for seeded rows, shared otherwise."""
        unseeded = [j for j, row in enumerate(rows) if row.params.seed is None]
        if len(unseeded) == len(rows):
            shared = self._generator(self._shared, device, fresh_seed=True)
            return torch.rand(len(rows), vocab, generator=shared, device=shared.device).to(device)
        noise = torch.empty(len(rows), vocab, device=device)
        if unseeded:
            shared = self._generator(self._shared, device, fresh_seed=True)
            drawn = torch.rand(len(unseeded), vocab, generator=shared, device=shared.device)
            noise[torch.tensor(unseeded, device=device)] = drawn.to(device)
        seeded = self._generator(self._seeded, device, fresh_seed=False)
        for j, row in enumerate(rows):
            if row.params.seed is not None:
                seeded.manual_seed(step_seed(row.params.seed, len(row.output_token_ids)))
                if seeded.device == noise.device:
                    noise[j].uniform_(generator=seeded)
                else:
                    noise[j] = torch.rand(vocab, generator=seeded).to(device)
        return noise

    @staticmethod
    def _generator(
        cache: dict[torch.device, torch.Generator], device: torch.device, *, fresh_seed: bool
    ) -> torch.Generator:
        """A generator on `device` when the device has them, else on the CPU (noise is moved)."""
        generator = cache.get(device)
        if generator is None:
            try:
                generator = torch.Generator(device=device)
            except RuntimeError:
                generator = torch.Generator()
            if fresh_seed:
                generator.seed()
            cache[device] = generator
        return generator

    def _outputs(
        self, raw: torch.Tensor, tokens: torch.Tensor, rows: Sequence[SamplingRow]
    ) -> list[SampledToken]:
        token_ids: list[int] = tokens.tolist()
        wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
        if not wanted:
            return [SampledToken(t) for t in token_ids]
        index = torch.tensor(wanted, device=raw.device)
        logprobs = torch.log_softmax(raw[index], dim=-1)
        chosen: list[float] = logprobs.gather(1, tokens[index][:, None]).squeeze(1).tolist()
        num_top = min(max(rows[i].params.logprobs or 0 for i in wanted), raw.shape[1])
        top_values: list[list[float]] = [[] for _ in wanted]
        top_ids: list[list[int]] = [[] for _ in wanted]
        if num_top:
            best = logprobs.topk(num_top, dim=-1)
            top_values, top_ids = best.values.tolist(), best.indices.tolist()
        outputs = [SampledToken(t) for t in token_ids]
        for k, i in enumerate(wanted):
            n = rows[i].params.logprobs or 0
            top = tuple(zip(top_ids[k][:n], top_values[k][:n], strict=True))
            outputs[i] = SampledToken(token_ids[i], chosen[k], top)
        return outputs
