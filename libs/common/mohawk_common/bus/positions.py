"""Who may talk to whom in a pipeline, and what each may send: the one rule for channels and frames.

A pipeline of N stages has these links and no others: stage i → i+1 (activations, and word of a
failed step), and the last stage → stage 0 (step results). A channel is opened by the lower
stage of each pair, so only stage i may open one to i+1, and stage 0 to the last stage; each frame
kind is accepted only from the stage that sends it. Anything else (a middle stage opening a
channel to stage 0, a step result from a stage other than the last, activations from a stage
other than the previous one) is refused and counted (`out_of_position`). Gateways never open a
channel: requests reach stage 0 sealed on the request stream.
"""

from __future__ import annotations

KIND_ACTIVATIONS = 1
KIND_RESULT = 2
KIND_FAILED = 3  # a stage could not run this step: the StepBatch goes on (no tensor) to the last stage


def may_open(initiator: int, responder: int, num_stages: int) -> bool:
    """Whether the stage at `initiator` may open a channel to the stage at `responder`."""
    if not 0 <= initiator < responder < num_stages:
        return False
    return responder == initiator + 1 or (initiator == 0 and responder == num_stages - 1)


def may_send(kind: int, sender: int, receiver: int, num_stages: int) -> bool:
    """Whether a frame of `kind` from the stage at `sender` is accepted by the stage at `receiver`."""
    if not (0 <= sender < num_stages and 0 <= receiver < num_stages):
        return False
    if kind in (KIND_ACTIVATIONS, KIND_FAILED):
        return receiver >= 1 and sender == receiver - 1
    if kind == KIND_RESULT:
        return receiver == 0 and sender == num_stages - 1
    return False
