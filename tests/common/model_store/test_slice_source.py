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
from mohawk_common.model_store.gguf_file import GGUFFile
from mohawk_common.model_store.gguf_source import gguf_tensor_name
from mohawk_common.model_store.quantized import DECODABLE_FORMATS
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
    for entry in manifest["tensors"]:  # the file's blocks where a kernel reads them, else float32
        assert entry["format"] == bundled.stored_format(entry["name"]), entry
        assert entry["dtype"] == ("U8" if entry["format"] in DECODABLE_FORMATS else "F32"), entry
    assert {t["format"] for t in manifest["tensors"]} == {"Q4_1", "F32"}
    # and how the file stores every other tensor, for a node sizing the whole model as one with it
    assert manifest["stored_formats"]["embed_tokens.weight"] == bundled.stored_format("embed_tokens.weight")
    assert len(manifest["stored_formats"]) == 30 * 9 + 2
    assert manifest["model_id"] == bundled.config.model_id
    assert "_name_or_path" not in manifest["hf_config"]  # nothing of the packer's disk
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(manifest["tokenizer_files"])


def test_a_package_is_its_layers_size_in_the_file(bundled: ModelSource) -> None:
    """The weights a package seals are the file's own blocks: within 1.1x (safetensors' header and
    the norms) of what those layers take in the GGUF, not the 4-5x of float32."""
    index = GGUFFile(bundled.path)
    for layers in (MIDDLE, TAIL, (0, 30)):
        fields, weights = slice_weights(bundled, *layers)
        in_file = sum(index.tensors[gguf_tensor_name(t["name"], "llama")].nbytes for t in fields["tensors"])
        assert in_file < len(weights) <= 1.1 * in_file, (layers, len(weights), in_file)


def test_slice_serves_the_source_blocks(middle_source: SliceSource, bundled: ModelSource) -> None:
    for name in bundled.load_weights(*MIDDLE, embedding=False, head=False):
        assert middle_source.stored_format(name) == bundled.stored_format(name)
        assert middle_source.stored_shape(name) == bundled.stored_shape(name)
        ours, theirs = middle_source.read_blocks(name), bundled.read_blocks(name)
        if theirs is None:
            assert ours is None and middle_source.read_quantized(name) is None
            continue
        assert ours is not None and ours.rows is None and ours.type_name == theirs.type_name
        want = theirs.raw if theirs.rows is None else theirs.raw[theirs.rows]
        np.testing.assert_array_equal(ours.raw, want, err_msg=name)
        got, expected = middle_source.read_quantized(name), bundled.read_quantized(name)
        assert got is not None and expected is not None
        np.testing.assert_array_equal(got.codes, expected.codes, err_msg=name)
        np.testing.assert_array_equal(got.scales, expected.scales, err_msg=name)
    for name in ("embed_tokens.weight", "lm_head.weight", "layers.0.mlp.down_proj.weight"):
        assert middle_source.stored_format(name) == bundled.stored_format(name)  # not held, still known


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
    blocks = next(i for i, t in enumerate(manifest["tensors"]) if t["dtype"] == "U8")
    for bad, needle in (
        ({"format": "Q2_K"}, "names no block format"),
        ({"dtype": "I64"}, "has dtype 'I64'"),
        ({"shape": [576, 100]}, "not whole blocks"),
        ({"shape": "576x576"}, "has no shape"),
    ):
        tensors = list(manifest["tensors"])
        tensors[blocks] = tensors[blocks] | bad
        with pytest.raises(ModelLoadError, match=needle):
            SliceSource.from_slice(manifest | {"tensors": tensors}, weights)
    tensors = list(manifest["tensors"])
    tensors[blocks] = tensors[blocks] | {"format": "Q8_0"}  # other block bytes than it carries
    with pytest.raises(ModelLoadError, match="not hold the tensors"):
        SliceSource.from_slice(manifest | {"tensors": tensors}, weights)
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
