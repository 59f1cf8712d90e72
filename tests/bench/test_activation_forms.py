"""bench/activation_forms.py's short form: one prompt, a few tokens, every form and compressor.

`make bench` runs it (MOHAWK_FULL=1); the saved full run (8 prompts x 64 tokens) is what the docs
quote: half-precision hand-overs change the greedy tokens, so the wire carries float32."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import run_bench

pytestmark = pytest.mark.full_form


def test_every_form_and_compressor_is_measured(tmp_path: Path) -> None:
    figures = run_bench("activation_forms.py", tmp_path / "forms.json", "--prompts", "2", "--tokens", "16")
    assert set(figures["forms"]) == {"bfloat16", "float16"}
    for form in figures["forms"].values():
        assert len(form["first_difference"]) == 2 and 0 <= form["differing"] <= 2
    for compressed in figures["compression"].values():
        assert compressed["raw_bytes"] == 576 * 4 and 0 < compressed["ratio"] < 1.2 and compressed["us"] > 0
