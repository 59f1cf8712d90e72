"""`mohawk generate` and `mohawk chat`: the engine in this process, stages chained in order."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mohawk_common.chat import encode_chat
from mohawk_common.settings import load_settings
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine.llm_engine import LLMEngine
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.local import build_local_engine


def _engine(args: argparse.Namespace) -> LLMEngine:
    overrides = {
        "model": args.model,
        "device": args.device,
        "dtype": args.dtype,
        "weights": args.weights,
        "kv_cache_dtype": args.kv_cache_dtype,
    }
    return build_local_engine(load_settings(EngineSettings, overrides), args.split, backends=args.backends)


def _stream(engine: LLMEngine, request_id: str, prompt: list[int], params: SamplingParams) -> str:
    engine.add_request(request_id, prompt, params)
    pieces = []
    for event in engine.run():
        sys.stdout.write(event.text)
        sys.stdout.flush()
        pieces.append(event.text)
    return "".join(pieces)


def run_generate(args: argparse.Namespace) -> int:
    params = SamplingParams.create(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=args.stop,
    )
    engine = _engine(args)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.prompt})
    _stream(engine, "generate", encode_chat(engine.tokenizer, messages), params)
    sys.stdout.write("\n")
    return 0


def run_chat(args: argparse.Namespace) -> int:
    params = SamplingParams.create(temperature=args.temperature, max_tokens=args.max_tokens)
    engine = _engine(args)
    messages: list[dict[str, Any]] = []
    print("Mohawk chat on the local engine. Empty line or Ctrl-D to quit.", file=sys.stderr)
    turn = 0
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            return 0
        if not line:
            return 0
        messages.append({"role": "user", "content": line})
        sys.stdout.write("mohawk> ")
        reply = _stream(engine, f"chat-{turn}", encode_chat(engine.tokenizer, messages), params)
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": reply})
        turn += 1
