"""A sequence that resumes mid-answer (step deadline, plan change) emits the same text as one that never
stopped, whichever token it resumes after: held-back bytes and stop-string prefixes are not lost."""

from __future__ import annotations

from typing import Any

import pytest

from mohawk_shard.engine.emitter import TokenEmitter
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.sampling_params import SamplingParams
from tests.shard.engine.test_detokenizer import tokenizer  # noqa: F401  (the bundled model's tokenizer)

PROMPT = [1, 2, 3]


def _texts(emitter: TokenEmitter, seq_id: int, ids: list[int]) -> list[str]:
    texts = []
    for token_id in ids:
        event = emitter.emit(seq_id, SampledToken(token_id))
        assert event is not None
        texts.append(event.text)
    return texts


@pytest.mark.parametrize(
    ("text", "stop"),
    [("Hola! 😊🌍🌍🌍 and 日本語 done", ()), ("one two END three four END five", ("END f",))],
)
def test_resuming_after_any_token_gives_the_same_text(
    tokenizer: Any,  # noqa: F811  (the imported fixture)
    text: str,
    stop: tuple[str, ...],
) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    params = SamplingParams(temperature=0.0, max_tokens=len(ids), stop=list(stop), ignore_eos=True)
    straight = TokenEmitter(tokenizer, [], 8192)
    straight.track(0, "r", params, len(PROMPT), PROMPT)
    expected = "".join(_texts(straight, 0, ids))
    for cut in range(1, len(ids)):
        emitter = TokenEmitter(tokenizer, [], 8192)
        emitter.track(0, "r", params, len(PROMPT), PROMPT)
        before = _texts(emitter, 0, ids[:cut])
        emitter.track(1, "r", params, len(PROMPT), PROMPT, ids[:cut])  # the resumed sequence
        after = _texts(emitter, 1, ids[cut:])
        assert "".join(before + after) == expected, cut
