"""Encrypted frames on an established channel: AES-256-GCM, counter nonces, a replay window, rotation.

Each direction of a channel has its own key and its own 64-bit sequence counter; the nonce is the
counter, so no (key, nonce) pair ever repeats. The frame's header is the AEAD's associated data:
whoever changes a byte of it, or of the ciphertext, fails the tag. The sender moves to the next key
(`keyschedule.next_key`) after `max_frames_per_key` frames or `max_key_age_s` seconds and says so
in the header's `key_epoch`; the receiver ratchets forward to that epoch and keeps the previous
key for frames still in flight, so rotation drops no traffic. The receiver accepts a sequence
number once: it keeps a sliding window of the last `REPLAY_WINDOW` numbers and rejects anything
seen or older; a number is marked seen only after its frame authenticated, so forged frames
cannot move the window.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.keyschedule import next_key

MAX_FRAMES_PER_KEY = 1 << 20
MAX_KEY_AGE_S = 600.0
REPLAY_WINDOW = 4096
_MAX_EPOCH_SKIP = 4

Clock = Callable[[], float]


def _nonce(seq: int) -> bytes:
    return b"\x00\x00\x00\x00" + seq.to_bytes(8, "big")


class FrameSender:
    """One direction's sending side: `next_seq()` numbers a frame, `encrypt` seals it under its header."""

    def __init__(
        self,
        key: bytes,
        *,
        max_frames_per_key: int = MAX_FRAMES_PER_KEY,
        max_key_age_s: float = MAX_KEY_AGE_S,
        clock: Clock = time.monotonic,
    ) -> None:
        self._key, self._aead = key, AESGCM(key)
        self._max_frames, self._max_age, self._clock = max_frames_per_key, max_key_age_s, clock
        self.epoch = 0
        self._seq = 0
        self._frames_in_epoch = 0
        self._epoch_started = clock()

    def next_seq(self) -> tuple[int, int]:
        """(sequence number, key epoch) for the next frame; rotates the key when it is due."""
        if self._frames_in_epoch >= self._max_frames or self._clock() - self._epoch_started >= self._max_age:
            self._key = next_key(self._key)
            self._aead = AESGCM(self._key)
            self.epoch += 1
            self._frames_in_epoch = 0
            self._epoch_started = self._clock()
        self._seq += 1
        self._frames_in_epoch += 1
        return self._seq, self.epoch

    def encrypt(self, seq: int, epoch: int, header: bytes, plaintext: bytes) -> bytes:
        if epoch != self.epoch:
            raise ValueError("a frame must be encrypted in the epoch next_seq() gave it")
        return self._aead.encrypt(_nonce(seq), plaintext, header)


class ReplayWindow:
    """Sliding window over sequence numbers: each accepted at most once, none older than the window."""

    def __init__(self, size: int = REPLAY_WINDOW) -> None:
        self.size = size
        self.highest = 0
        self._seen = 0  # bit i set: sequence number highest - i was accepted

    def check(self, seq: int) -> None:
        if seq <= 0:
            raise AuthenticationError("replayed", f"sequence number {seq}")
        if seq > self.highest:
            return
        offset = self.highest - seq
        if offset >= self.size or (self._seen >> offset) & 1:
            raise AuthenticationError("replayed", f"sequence number {seq} (highest {self.highest})")

    def mark(self, seq: int) -> None:
        if seq > self.highest:
            shift = seq - self.highest
            self._seen = ((self._seen << shift) | 1) & ((1 << self.size) - 1)
            self.highest = seq
        else:
            self._seen |= 1 << (self.highest - seq)


class FrameReceiver:
    """One direction's receiving side: authenticates, de-duplicates and decrypts frames."""

    def __init__(self, key: bytes, *, window: int = REPLAY_WINDOW) -> None:
        self.epoch = 0
        self._keys: dict[int, AESGCM] = {0: AESGCM(key)}
        self._newest_key = key
        self.window = ReplayWindow(window)

    def decrypt(self, seq: int, epoch: int, header: bytes, ciphertext: bytes) -> bytes:
        self.window.check(seq)
        aead, ratchet = self._key_for(epoch)
        try:
            plaintext = aead.decrypt(_nonce(seq), ciphertext, header)
        except InvalidTag as exc:
            raise AuthenticationError("tampered", f"frame {seq} failed its tag") from exc
        self.window.mark(seq)
        if ratchet:  # only an authenticated frame moves the receiver to a new key
            for e, key in ratchet:
                self._keys[e] = AESGCM(key)
            self._newest_key = ratchet[-1][1]
        if epoch > self.epoch:
            self.epoch = epoch
            for old in [e for e in self._keys if e < epoch - 1]:
                del self._keys[old]
        return plaintext

    def _key_for(self, epoch: int) -> tuple[AESGCM, list[tuple[int, bytes]]]:
        if epoch in self._keys:
            return self._keys[epoch], []
        newest = max(self._keys)
        if epoch < newest or epoch - newest > _MAX_EPOCH_SKIP:
            raise AuthenticationError("replayed" if epoch < newest else "tampered", f"key epoch {epoch}")
        key, ratchet = self._newest_key, []
        for e in range(newest + 1, epoch + 1):
            key = next_key(key)
            ratchet.append((e, key))
        return AESGCM(key), ratchet
