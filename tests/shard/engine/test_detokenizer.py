"""IncrementalDetokenizer against the bundled model's real tokenizer, and StopStringMatcher."""

from __future__ import annotations

from typing import Any

import pytest

from mohawk_common.model_store import open_model
from mohawk_shard.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher

TEXTS = [
    "Hello there, world. How are you doing today?  Fine , thanks !",
    'def add(a, b):\n    """Add."""\n    if a:\n\t\treturn a + b\n\n\nprint(add(1, 2))\n',
    "Emoji 😀🚀👍🏽 and CJK 日本語のテキスト、中文字符 mixed with ASCII.",
    "été naïve façade — “quotes” … ½ ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The bundled model's tokenizer, as a node loads it (test_gguf_cache.py shows it is the one
    transformers reads from the file)."""
    return open_model(None).load_tokenizer()


def _stream(tokenizer: Any, ids: list[int], prompt: list[int] | None = None) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt or ())
    deltas = []
    for i, token_id in enumerate(ids):
        deltas.append(detok.add(token_id))
        emitted = "".join(deltas)
        assert detok.text == emitted
        full = tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        if not full.endswith("\ufffd"):  # nothing pending: the stream has caught up exactly
            assert emitted == full, (i, emitted, full)
        else:
            assert full.startswith(emitted)
    return deltas


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_match_full_decode(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = _stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True) == text


def test_multibyte_characters_are_held_until_complete(tokenizer: Any) -> None:
    ids = tokenizer.encode("😀", add_special_tokens=False)
    assert len(ids) > 1  # a byte-level split: the test means something only then
    deltas = _stream(tokenizer, ids)
    assert deltas[:-1] == [""] * (len(ids) - 1)
    assert deltas[-1] == "😀"


def test_prompt_window_and_special_tokens(tokenizer: Any) -> None:
    prompt = tokenizer.encode(
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    answer = tokenizer.encode(" Sure, here it is: 日本", add_special_tokens=False)
    ids = [*answer[:3], tokenizer.convert_tokens_to_ids("<|im_end|>"), *answer[3:]]
    deltas = _stream(tokenizer, ids, prompt)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)
    full = tokenizer.decode([*prompt, *ids], skip_special_tokens=True)
    assert full.endswith("".join(deltas))

    kept = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=False)
    text = "".join(kept.add(t) for t in ids)
    assert text == tokenizer.decode(ids, skip_special_tokens=False)
    assert "<|im_end|>" in text


class _SentencePieceLike:
    """Decodes like Llama's tokenizer: '▁' is a space and a leading space is dropped."""

    pieces = ("▁Hello", "▁world", "!")

    def decode(self, token_ids: list[int], **kwargs: Any) -> str:
        return "".join(self.pieces[t] for t in token_ids).replace("▁", " ").removeprefix(" ")


def test_prompt_window_keeps_the_leading_space() -> None:
    tokenizer = _SentencePieceLike()
    detok = IncrementalDetokenizer(tokenizer, [0])  # type: ignore[arg-type]
    assert [detok.add(1), detok.add(2)] == [" world", "!"]
    assert tokenizer.decode([0]) + detok.text == tokenizer.decode([0, 1, 2])
    assert IncrementalDetokenizer(tokenizer).add(1) == "world"  # type: ignore[arg-type]


def test_decodes_only_a_window(tokenizer: Any) -> None:
    ids = tokenizer.encode(" ".join(["word"] * 200), add_special_tokens=False)
    lengths: list[int] = []
    real_decode = tokenizer.decode

    class Spy:
        def decode(self, token_ids: list[int], **kwargs: Any) -> str:
            lengths.append(len(token_ids))
            return str(real_decode(token_ids, **kwargs))

    detok = IncrementalDetokenizer(Spy(), ())  # type: ignore[arg-type]
    for t in ids:
        detok.add(t)
    assert detok.text == real_decode(ids)
    assert max(lengths) <= 3


def _feed_all(matcher: StopStringMatcher, deltas: list[str]) -> tuple[str, bool]:
    out = []
    for delta in deltas:
        text, stopped = matcher.feed(delta)
        out.append(text)
        if stopped:
            return "".join(out), True
    out.append(matcher.flush())
    return "".join(out), False


def test_stop_split_across_deltas() -> None:
    matcher = StopStringMatcher(["</answer>"])
    assert matcher.feed("The result is 4</") == ("The result is 4", False)
    assert matcher.feed("ans") == ("", False)
    assert matcher.feed("wer> trailing") == ("", True)
    assert matcher.stopped
    with pytest.raises(RuntimeError):
        matcher.feed("more")


def test_false_start_is_released() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("a ST") == ("a ", False)
    assert matcher.feed("O") == ("", False)
    assert matcher.feed("P") == ("", True)
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("a ST") == ("a ", False)
    assert matcher.feed("OR") == ("STOR", False)
    assert matcher.feed("Y S") == ("Y ", False)
    assert matcher.flush() == "S"
    assert matcher.flush() == ""


def test_multiple_stop_strings_earliest_wins() -> None:
    matcher = StopStringMatcher(["\n\n", "User:", "###"])
    assert matcher.feed("one ##") == ("one ", False)
    assert matcher.feed(" two User") == ("## two ", False)
    assert matcher.feed(": x ### y\n\n") == ("", True)
    assert _feed_all(StopStringMatcher(["bb", "abc"]), ["xab", "c bb"]) == ("x", True)
    assert _feed_all(StopStringMatcher(["c", "abcd"]), ["ab", "cd"]) == ("", True)


def test_stop_at_the_very_beginning() -> None:
    matcher = StopStringMatcher(["<|end|>"])
    assert matcher.feed("<|end|>rest") == ("", True)
    assert _feed_all(StopStringMatcher(["<|end|>"]), ["<", "|e", "nd|", ">"]) == ("", True)


def test_flush_at_finish_and_no_stops() -> None:
    assert _feed_all(StopStringMatcher(["END"]), ["the E", "N"]) == ("the EN", False)
    assert _feed_all(StopStringMatcher([]), ["abc", "def"]) == ("abcdef", False)
    assert StopStringMatcher([]).feed("x") == ("x", False)
