"""The stream file: an attempt's audio as 16-bit PCM, appended while it is encoded.

A worker writes it beside its output file (``StreamWriter``); the web tier reads
it while it grows (``StreamReader``) and sends the audio to a client as the
sentences finish. It is a sequence of records, so a reader never mistakes a
half-written tail for data:

* ``H`` header: sample rate and the characters of all sentences (u32, u32)
* ``A`` audio: little-endian int16 samples, exactly the samples the output file gets
* ``T`` timestamps: that sentence's words and span as JSON (synth.timestamps), before its ``S``
* ``S`` sentence end: that sentence's characters (u32), written after its audio
* ``E`` end: the output file is complete

Each record is ``kind (1 byte) + payload length (u32 LE) + payload``. Only the
standard library is imported: the web tier reads this.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

_HEAD = struct.Struct("<cI")
_U32 = struct.Struct("<I")
HEADER, AUDIO, SENTENCE, END, TIMESTAMPS = b"H", b"A", b"S", b"E", b"T"


class StreamWriter:
    """Appends one attempt's audio records to ``path`` (flushed per record, so readers see them).

    ``on_grew`` is called once the header, each sentence and the end are on disk:
    the worker tells streaming readers there, so they wait for it instead of
    looking at the file on a timer. A sentence that arrives in parts (a remote
    model's stream) also tells them after a part (:meth:`part_written`), at most
    every ``PART_NOTICE_SECONDS``.
    """

    PART_NOTICE_SECONDS = 0.1

    def __init__(self, path: str, on_grew: Callable[[], None] | None = None) -> None:
        self.path = path
        self.on_grew = on_grew
        self._file: BinaryIO | None = None
        self._told = 0.0  # time.monotonic() of the last notice

    def _grew(self) -> None:
        self._told = time.monotonic()
        if self.on_grew is not None:
            self.on_grew()

    def part_written(self) -> None:
        """A part of a sentence is on disk: readers may send it before the sentence ends."""
        if time.monotonic() - self._told >= self.PART_NOTICE_SECONDS:
            self._grew()

    def _record(self, kind: bytes, payload: bytes) -> None:
        if self._file is None:
            return
        self._file.write(_HEAD.pack(kind, len(payload)) + payload)
        self._file.flush()

    def open(self, sample_rate: int, total_chars: int) -> None:
        self._file = open(self.path, "wb")  # closed by close()
        self._record(HEADER, _U32.pack(sample_rate) + _U32.pack(total_chars))
        self._grew()

    def audio(self, pcm16: bytes) -> None:
        if pcm16:
            self._record(AUDIO, pcm16)

    def timestamps(self, event: dict[str, Any]) -> None:
        self._record(TIMESTAMPS, json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode())

    def sentence_done(self, chars: int) -> None:
        self._record(SENTENCE, _U32.pack(chars))
        self._grew()

    def finish(self) -> None:
        """The output file is complete: readers may stop after this record."""
        self._record(END, b"")
        self.close()
        self._grew()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def remove(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


@dataclass
class StreamReader:
    """Reads the complete records that have arrived so far; keeps its place between calls."""

    handle: BinaryIO
    sample_rate: int = 0
    total_chars: int = 0
    ended: bool = False
    audio_bytes: int = 0  # audio handed out so far
    sentences: list[tuple[int, int]] = field(default_factory=list)  # (audio bytes at its end, characters)
    # Per sentence, as written (``T``): (audio bytes read when it came, the sentence's timestamps).
    timestamps: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    _buffer: bytes = b""

    def read(self) -> bytes:
        """The audio that arrived since the last call (b"" when none)."""
        self._buffer += self.handle.read()
        out: list[bytes] = []
        while len(self._buffer) >= _HEAD.size:
            kind, size = _HEAD.unpack_from(self._buffer)
            end = _HEAD.size + size
            if len(self._buffer) < end:
                break  # the writer is still writing this record
            payload, self._buffer = self._buffer[_HEAD.size : end], self._buffer[end:]
            if kind == HEADER:
                self.sample_rate, self.total_chars = (
                    _U32.unpack_from(payload)[0],
                    _U32.unpack_from(payload, 4)[0],
                )
            elif kind == AUDIO:
                out.append(payload)
                self.audio_bytes += len(payload)
            elif kind == TIMESTAMPS:
                try:
                    self.timestamps.append((self.audio_bytes, json.loads(payload)))
                except ValueError:
                    pass  # a reader never fails on what only decorates the audio
            elif kind == SENTENCE:
                self.sentences.append((self.audio_bytes, _U32.unpack(payload)[0]))
            elif kind == END:
                self.ended = True
        return b"".join(out)

    def characters_heard(self, delivered_bytes: int) -> int:
        """Characters of the sentences whose audio lies within the first ``delivered_bytes``."""
        return sum(chars for end, chars in self.sentences if end <= delivered_bytes)


def stream_path(out_path: str) -> str:
    """The stream file of an output file: a hidden ``.part`` beside it (temp files by every sweep's rules)."""
    directory, base = os.path.split(out_path)
    return os.path.join(directory, f".{base}.stream.part")
