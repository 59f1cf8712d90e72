"""Slices of the bundled model: packed for one node, opened there, served only within their range."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from mohawk_common.bus.names import SLICES_BUCKET, slice_object_name
from mohawk_common.bus.server import NatsServer
from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store import ModelSource
from mohawk_common.model_store.slice_fetch import fetch_slice, fetch_slice_source, push_slice
from mohawk_common.model_store.slice_source import (
    SliceSource,
    model_fingerprint,
    open_slice_source,
    slice_weights,
)
from mohawk_pqc.certificates import Root, TrustStore, issue_certificate, root_public
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.identity import Identity, KemKeyPair, certificate_body_for
from mohawk_pqc.signing import SigningKey
from mohawk_pqc.slices import SlicePackage, open_slice, pack_slice

MIDDLE = (3, 5)
TAIL = (28, 30)
MODEL = "smollm2-135m-instruct"


@dataclass
class Operator:
    root_key: SigningKey
    trust: TrustStore
    node_a: Identity
    node_b: Identity

    def pack(self, fields: dict[str, Any], weights: bytes, to: Identity | None = None) -> SlicePackage:
        return pack_slice(self.root_key, (to or self.node_a).certificate, fields, weights)


def _identity(root_key: SigningKey, node_id: str, serial: int) -> Identity:
    signing, kem = SigningKey.generate(), KemKeyPair.generate()
    body = certificate_body_for(
        node_id, "shard", signing, kem, serial=serial, not_before=0.0, not_after=4102444800.0
    )
    return Identity(issue_certificate(root_key, body), signing, kem)


@pytest.fixture(scope="module")
def operator() -> Operator:
    root_key = SigningKey.generate()
    return Operator(
        root_key,
        TrustStore(Root(root_public(root_key))),
        _identity(root_key, "node-a", 11),
        _identity(root_key, "node-b", 12),
    )


def _fields(source: ModelSource, layers: tuple[int, int]) -> tuple[dict[str, Any], bytes]:
    fields, weights = slice_weights(source, *layers)
    return fields | {
        "model_revision": model_fingerprint(source),
        "served_model": MODEL,
        "policy_tags": [],
    }, weights


@pytest.fixture(scope="module")
def middle(bundled: ModelSource, operator: Operator) -> SlicePackage:
    return operator.pack(*_fields(bundled, MIDDLE))


@pytest.fixture(scope="module")
def middle_source(middle: SlicePackage, operator: Operator) -> SliceSource:
    return open_slice_source(middle, operator.node_a, operator.trust)


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name, array in want.items():
        assert got[name].dtype == np.float32 and got[name].flags.c_contiguous, name
        np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_manifest_describes_the_range(middle: SlicePackage, bundled: ModelSource) -> None:
    manifest = middle.unverified_manifest()
    assert (manifest["layer_start"], manifest["layer_end"]) == MIDDLE
    assert manifest["embedding"] is False and manifest["head"] is False
    names = [t["name"] for t in manifest["tensors"]]
    assert names == list(bundled.load_weights(*MIDDLE, embedding=False, head=False))
    assert all(t["dtype"] == "F32" for t in manifest["tensors"])
    assert manifest["model_id"] == bundled.config.model_id
    assert "_name_or_path" not in manifest["hf_config"]  # nothing of the packer's disk
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(manifest["tokenizer_files"])


def test_slice_serves_the_source_weights(middle_source: SliceSource, bundled: ModelSource) -> None:
    want = bundled.load_weights(*MIDDLE, embedding=False, head=False)
    assert_same(middle_source.load_weights(*MIDDLE, embedding=False, head=False), want)
    sub = middle_source.load_weights(4, 5, embedding=False, head=False)
    assert_same(sub, {k: v for k, v in want.items() if k.startswith("layers.4.")})


@pytest.mark.parametrize(
    ("start", "end", "embedding", "head", "needle"),
    [
        (2, 4, False, False, "layers [2, 4)"),
        (3, 6, False, False, "layers [3, 6)"),
        (3, 5, True, False, "the embedding"),
        (3, 5, False, True, "the LM head"),
    ],
)
def test_slice_refuses_what_it_does_not_hold(
    middle_source: SliceSource, start: int, end: int, embedding: bool, head: bool, needle: str
) -> None:
    with pytest.raises(ModelLoadError, match="not in this slice") as info:
        middle_source.load_weights(start, end, embedding=embedding, head=head)
    assert needle in str(info.value) and "holds layers [3, 5)" in str(info.value)


def test_slice_carries_config_and_tokenizer(middle_source: SliceSource, bundled: ModelSource) -> None:
    assert middle_source.config == bundled.config
    assert (
        middle_source.hf_config.to_dict()["rope_parameters"] == bundled.hf_config.to_dict()["rope_parameters"]
    )
    ours, theirs = middle_source.load_tokenizer(), bundled.load_tokenizer()
    messages = [{"role": "user", "content": "What is the capital of France? Ünïcode ✓"}]
    assert ours.apply_chat_template(messages, tokenize=False) == theirs.apply_chat_template(
        messages, tokenize=False
    )
    text = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours(text).input_ids == theirs(text).input_ids
    assert ours.eos_token_id == theirs.eos_token_id


def test_tail_slice_holds_a_tied_head_once(bundled: ModelSource, operator: Operator) -> None:
    fields, weights = _fields(bundled, TAIL)
    assert fields["head"] is True and fields["embedding"] is False
    names = [t["name"] for t in fields["tensors"]]
    assert "lm_head.weight" not in names and names.count("embed_tokens.weight") == 1  # tied: stored once
    source = open_slice_source(operator.pack(fields, weights), operator.node_a, operator.trust)
    assert_same(
        source.load_weights(*TAIL, embedding=False, head=True),
        bundled.load_weights(*TAIL, embedding=False, head=True),
    )
    with pytest.raises(ModelLoadError, match="the embedding"):
        source.load_weights(*TAIL, embedding=True, head=True)


def test_other_node_and_other_revision_are_refused(middle: SlicePackage, operator: Operator) -> None:
    with pytest.raises(AuthenticationError) as info:
        open_slice_source(middle, operator.node_b, operator.trust)
    assert info.value.reason == "untrusted"
    with pytest.raises(AuthenticationError) as info:
        open_slice_source(middle, operator.node_a, operator.trust, expect_model_revision="v999")
    assert info.value.reason == "bad_version"
    with pytest.raises(AuthenticationError) as info:
        open_slice_source(middle, operator.node_a, operator.trust, expect_model="another-model")
    assert info.value.reason == "bad_version"


def test_slice_checks_a_stage_before_anything_loads(middle_source: SliceSource, bundled: ModelSource) -> None:
    middle_source.check_holds(*MIDDLE)
    middle_source.check_holds(MIDDLE[0], MIDDLE[0] + 1)
    for start, end in ((MIDDLE[0] - 1, MIDDLE[1]), (MIDDLE[0], MIDDLE[1] + 1), (0, 30)):
        with pytest.raises(AuthenticationError) as info:
            middle_source.check_holds(start, end)
        assert info.value.reason == "bad_version" and "the slice holds [3, 5)" in info.value.detail


def test_slice_without_embedding_or_head_refuses_stage_0_and_the_last(
    bundled: ModelSource, operator: Operator
) -> None:
    fields, weights = _fields(bundled, (0, 2))
    no_embedding = open_slice_source(
        operator.pack(fields | {"embedding": False}, weights), operator.node_a, operator.trust
    )
    with pytest.raises(AuthenticationError, match="lacks the embedding") as info:
        no_embedding.check_holds(0, 2)
    assert info.value.reason == "bad_version"
    fields, weights = _fields(bundled, TAIL)
    no_head = open_slice_source(
        operator.pack(fields | {"head": False}, weights), operator.node_a, operator.trust
    )
    with pytest.raises(AuthenticationError, match="lacks the LM head"):
        no_head.check_holds(*TAIL)


def test_verified_but_inconsistent_slices_fail_to_load(middle: SlicePackage, operator: Operator) -> None:
    manifest, weights = open_slice(middle, operator.node_a, operator.trust)
    with pytest.raises(ModelLoadError, match="not hold the tensors"):
        SliceSource.from_slice(manifest | {"tensors": manifest["tensors"][:-1]}, weights)
    with pytest.raises(ModelLoadError, match="not a safetensors file"):
        SliceSource.from_slice(manifest, b"garbage")
    with pytest.raises(ModelLoadError, match="not a usable model slice"):
        SliceSource.from_slice({k: v for k, v in manifest.items() if k != "hf_config"}, weights)
    with pytest.raises(ModelLoadError, match="does not fit"):
        SliceSource.from_slice(manifest | {"layer_end": 31}, weights)


def test_slice_weights_refuses_a_bad_range(bundled: ModelSource) -> None:
    with pytest.raises(ModelLoadError, match="invalid layer range"):
        slice_weights(bundled, 28, 31)


def test_object_store_round_trip(nats_server: NatsServer, middle: SlicePackage, operator: Operator) -> None:
    async def scenario() -> tuple[SlicePackage, SliceSource]:
        import nats

        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            with pytest.raises(ModelLoadError, match="does not exist"):
                await fetch_slice(js, MODEL, "node-a")
            assert await push_slice(js, middle) == slice_object_name(MODEL, "node-a")
            assert await push_slice(js, middle) == slice_object_name(MODEL, "node-a")  # bucket exists now
            with pytest.raises(ModelLoadError, match="no slice package"):
                await fetch_slice(js, MODEL, "node-b")
            info = await (await js.object_store(SLICES_BUCKET)).get_info(slice_object_name(MODEL, "node-a"))
            assert info.size == len(middle.to_bytes())
            fetched = await fetch_slice(js, MODEL, "node-a")
            source = await fetch_slice_source(js, MODEL, "node-a", operator.node_a, operator.trust)
            return fetched, source
        finally:
            await nc.close()

    fetched, source = asyncio.run(scenario())
    assert fetched == middle  # byte-identical, all three files
    assert source.load_weights(*MIDDLE, embedding=False, head=False).keys() == {
        t["name"] for t in json.loads(middle.manifest_bytes)["tensors"]
    }


def test_fetched_package_must_be_of_the_model_and_revision_asked(
    nats_server: NatsServer, bundled: ModelSource, operator: Operator
) -> None:
    """The object's name is no proof: a validly signed package of another model (or another
    revision) stored under this model's name is refused, and nothing loads."""
    fields, weights = _fields(bundled, MIDDLE)
    other_model = operator.pack(fields | {"served_model": "another-model"}, weights)

    async def scenario() -> list[str]:
        import nats

        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            await push_slice(js, other_model)
            store = await js.object_store(SLICES_BUCKET)
            await store.put(slice_object_name(MODEL, "node-a"), other_model.to_bytes())
            reasons = []
            for model, revision in ((MODEL, None), ("another-model", "v999")):
                with pytest.raises(AuthenticationError) as info:
                    await fetch_slice_source(
                        js, model, "node-a", operator.node_a, operator.trust, expect_model_revision=revision
                    )
                reasons.append(info.value.detail)
            source = await fetch_slice_source(
                js,
                "another-model",
                "node-a",
                operator.node_a,
                operator.trust,
                expect_model_revision=fields["model_revision"],
            )
            assert source.manifest["served_model"] == "another-model"
            return reasons
        finally:
            await nc.close()

    assert asyncio.run(scenario()) == [
        f"slice of model 'another-model', not {MODEL!r}",
        f"model revision {fields['model_revision']!r}, not 'v999'",
    ]
