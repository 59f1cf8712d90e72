"""The short form of bench/resume_floor.py on the bundled model: the re-prefill of 16 streams after a
failover, all layers and each of three stages' share, and with the survivors' KV carried, where only
the dead middle stage's layers are computed (`make bench` runs it on the 1.7B file too)."""

from __future__ import annotations

from pathlib import Path

from tests.bench import run_bench


def test_the_resume_of_16_streams_splits_into_three_stages_shares(tmp_path: Path) -> None:
    figures = run_bench("resume_floor.py", tmp_path / "resume.json", "--repeats", "1", "--emitted", "2")
    (bundled,) = figures["files"].values()
    assert bundled["split_points"] == [10, 20]  # the bundled model's 30 layers in thirds
    assert bundled["tokens"] > 16 * 20  # chat-templated prompts and the 2 tokens each was sent
    runs = bundled["runs"]
    (total,) = runs["resume, all layers"]
    stages = [runs[f"stage {i} forward"][0] for i in range(3)]
    assert all(s > 0 for s in stages), stages
    assert sum(stages) <= total  # the forwards are inside the resume
    # Three equal thirds of the layers: each stage's share is about a third of the forwards, so
    # the floor with the survivors' KV kept is well under the whole resume.
    assert max(stages) < 0.6 * sum(stages), stages
    # The survivors' KV carried: the first and last stages compute each history's last position
    # only, the middle every position.
    kept = [runs[f"stage {i} forward, survivors' KV kept"][0] for i in range(3)]
    assert kept[0] < 0.5 * kept[1] and kept[2] < 0.5 * kept[1], kept
