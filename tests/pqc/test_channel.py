"""Encrypted frames: authenticated headers, the replay window, and key rotation without loss."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mohawk_pqc.channel import FrameReceiver, FrameSender, ReplayWindow
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.keyschedule import next_key
from tests.pqc.helpers import Clock, flip

KEY = bytes(range(32))
WINDOW = 16


@dataclass(frozen=True)
class Frame:
    seq: int
    epoch: int
    header: bytes
    ciphertext: bytes
    plaintext: bytes


def send(sender: FrameSender, count: int) -> list[Frame]:
    frames = []
    for _ in range(count):
        seq, epoch = sender.next_seq()
        header, plaintext = f"hdr seq={seq}".encode(), f"payload {seq}".encode()
        frames.append(Frame(seq, epoch, header, sender.encrypt(seq, epoch, header, plaintext), plaintext))
    return frames


def deliver(receiver: FrameReceiver, frame: Frame) -> bytes:
    return receiver.decrypt(frame.seq, frame.epoch, frame.header, frame.ciphertext)


def refused(receiver: FrameReceiver, frame: Frame) -> str:
    with pytest.raises(AuthenticationError) as caught:
        deliver(receiver, frame)
    return caught.value.reason


def test_frames_round_trip() -> None:
    receiver = FrameReceiver(KEY)
    frames = send(FrameSender(KEY), 5)
    assert [f.seq for f in frames] == [1, 2, 3, 4, 5]
    assert [deliver(receiver, f) for f in frames] == [f.plaintext for f in frames]


@pytest.mark.parametrize("part", ["header", "ciphertext", "tag"])
@pytest.mark.parametrize("index", [0, 5])
def test_a_flipped_bit_in_header_or_ciphertext_is_tampered(part: str, index: int) -> None:
    (frame,) = send(FrameSender(KEY), 1)
    if part == "header":
        bad = Frame(frame.seq, frame.epoch, flip(frame.header, index), frame.ciphertext, b"")
    elif part == "ciphertext":
        bad = Frame(frame.seq, frame.epoch, frame.header, flip(frame.ciphertext, index), b"")
    else:
        bad = Frame(frame.seq, frame.epoch, frame.header, flip(frame.ciphertext, -1 - index), b"")
    receiver = FrameReceiver(KEY)
    assert refused(receiver, bad) == "tampered"
    assert deliver(receiver, frame) == frame.plaintext  # the forgery used up nothing


def test_a_frame_under_another_sequence_number_is_tampered() -> None:
    """The sequence number is the nonce: moving a frame to another number breaks its tag."""
    first, second = send(FrameSender(KEY), 2)
    moved = Frame(second.seq, first.epoch, first.header, first.ciphertext, b"")
    assert refused(FrameReceiver(KEY), moved) == "tampered"


def test_a_frame_under_another_key_is_tampered() -> None:
    (frame,) = send(FrameSender(KEY), 1)
    assert refused(FrameReceiver(bytes(32)), frame) == "tampered"


def test_the_same_sequence_number_twice_is_replayed() -> None:
    receiver = FrameReceiver(KEY)
    first, second = send(FrameSender(KEY), 2)
    deliver(receiver, first)
    deliver(receiver, second)
    assert refused(receiver, first) == "replayed"
    assert refused(receiver, second) == "replayed"


def test_sequence_number_zero_is_refused() -> None:
    assert refused(FrameReceiver(KEY), Frame(0, 0, b"", b"\x00" * 16, b"")) == "replayed"


def test_out_of_order_within_the_window_is_accepted_once() -> None:
    receiver = FrameReceiver(KEY, window=WINDOW)
    frames = send(FrameSender(KEY), 10)
    order = [9, 2, 4, 0, 8, 1, 3, 7, 5, 6]  # indexes into frames
    for i in order:
        assert deliver(receiver, frames[i]) == frames[i].plaintext
    for i in order:
        assert refused(receiver, frames[i]) == "replayed"


def test_older_than_the_window_is_rejected() -> None:
    receiver = FrameReceiver(KEY, window=WINDOW)
    frames = send(FrameSender(KEY), 40)
    late_inside, late_outside = frames[40 - WINDOW], frames[40 - WINDOW - 1]  # offsets 15 and 16
    for frame in frames:
        if frame not in (late_inside, late_outside):
            deliver(receiver, frame)
    assert receiver.window.highest == 40
    assert refused(receiver, late_outside) == "replayed"
    assert deliver(receiver, late_inside) == late_inside.plaintext


def test_a_jump_far_ahead_slides_the_window() -> None:
    window = ReplayWindow(WINDOW)
    for seq in (1, 2, 3):
        window.check(seq)
        window.mark(seq)
    window.check(1000)
    window.mark(1000)
    for seq in (3, 1000 - WINDOW):
        with pytest.raises(AuthenticationError):
            window.check(seq)
    window.check(1000 - WINDOW + 1)  # inside the window and never seen


def test_forged_frames_move_neither_the_window_nor_the_epoch() -> None:
    sender = FrameSender(KEY, max_frames_per_key=2)
    frames = send(sender, 6)  # epochs 0, 0, 1, 1, 2, 2
    receiver = FrameReceiver(KEY, window=WINDOW)
    deliver(receiver, frames[0])
    forged = [
        Frame(500, 0, b"forged", b"\x00" * 32, b""),  # far ahead in sequence
        Frame(frames[4].seq, frames[4].epoch, frames[4].header, flip(frames[4].ciphertext), b""),  # epoch 2
        Frame(frames[1].seq, 0, frames[1].header, flip(frames[1].ciphertext), b""),  # the next frame
    ]
    for frame in forged:
        assert refused(receiver, frame) == "tampered"
    assert (receiver.window.highest, receiver.epoch) == (1, 0)
    assert [deliver(receiver, f) for f in frames[1:]] == [f.plaintext for f in frames[1:]]


# --- key rotation -----------------------------------------------------------------------------------


def test_rotation_by_frame_count_drops_nothing() -> None:
    sender = FrameSender(KEY, max_frames_per_key=3)
    receiver = FrameReceiver(KEY)
    frames = send(sender, 20)
    assert [f.epoch for f in frames[:7]] == [0, 0, 0, 1, 1, 1, 2]
    assert len({f.seq for f in frames}) == 20  # the counter never restarts: no nonce repeats
    for frame in frames:
        assert deliver(receiver, frame) == frame.plaintext
        assert receiver.epoch == frame.epoch
    assert sender.epoch == receiver.epoch == 6


def test_rotation_by_age_with_an_injected_clock() -> None:
    clock = Clock(0.0)
    sender = FrameSender(KEY, max_key_age_s=10.0, clock=clock)
    receiver = FrameReceiver(KEY)
    frames = send(sender, 3)
    clock.now = 9.9
    frames += send(sender, 1)
    clock.now = 10.0
    frames += send(sender, 2)
    clock.now = 25.0
    frames += send(sender, 1)
    assert [f.epoch for f in frames] == [0, 0, 0, 0, 1, 1, 2]
    assert [deliver(receiver, f) for f in frames] == [f.plaintext for f in frames]


def test_the_rotated_key_is_next_key() -> None:
    sender = FrameSender(KEY, max_frames_per_key=1)
    _, second = send(sender, 2)
    receiver = FrameReceiver(next_key(KEY))  # a receiver that starts where epoch 1 begins
    assert receiver.decrypt(second.seq, 0, second.header, second.ciphertext) == second.plaintext


def test_frames_of_the_previous_epoch_arriving_late_are_accepted() -> None:
    sender = FrameSender(KEY, max_frames_per_key=3)
    receiver = FrameReceiver(KEY)
    frames = send(sender, 9)  # epochs 0 0 0 1 1 1 2 2 2
    held_back = [frames[1], frames[2], frames[5]]
    for frame in frames[:6]:
        if frame not in held_back:
            deliver(receiver, frame)
    assert receiver.epoch == 1
    assert deliver(receiver, frames[1]) == frames[1].plaintext  # epoch 0, after epoch 1 began
    deliver(receiver, frames[6])  # epoch 2 begins: epoch 1 is still the previous one
    assert deliver(receiver, frames[5]) == frames[5].plaintext
    assert refused(receiver, frames[2]) == "replayed"  # epoch 0 is two behind: its key is gone


def test_an_epoch_skipped_entirely_is_followed() -> None:
    sender = FrameSender(KEY, max_frames_per_key=1)
    frames = send(sender, 5)  # epochs 0..4
    receiver = FrameReceiver(KEY)
    deliver(receiver, frames[0])
    assert deliver(receiver, frames[4]) == frames[4].plaintext  # four epochs ahead at once
    assert deliver(receiver, frames[3]) == frames[3].plaintext  # the previous epoch, late
    assert refused(receiver, frames[2]) == "replayed"


def test_an_epoch_far_ahead_is_rejected() -> None:
    sender = FrameSender(KEY, max_frames_per_key=1)
    frames = send(sender, 7)  # epochs 0..6
    receiver = FrameReceiver(KEY)
    deliver(receiver, frames[0])
    assert refused(receiver, frames[6]) in ("tampered", "replayed")
    assert receiver.epoch == 0 and receiver.window.highest == 1
    for frame in frames[1:]:  # in order, each step is small and nothing was lost
        deliver(receiver, frame)


def test_a_frame_labelled_with_the_wrong_epoch_is_tampered() -> None:
    sender = FrameSender(KEY, max_frames_per_key=1)
    _, second = send(sender, 2)
    receiver = FrameReceiver(KEY)
    assert refused(receiver, Frame(second.seq, 0, second.header, second.ciphertext, b"")) == "tampered"
    assert receiver.epoch == 0


def test_the_sender_refuses_a_frame_outside_its_epoch() -> None:
    sender = FrameSender(KEY, max_frames_per_key=1)
    seq, epoch = sender.next_seq()
    sender.next_seq()
    with pytest.raises(ValueError):
        sender.encrypt(seq, epoch, b"", b"late")
