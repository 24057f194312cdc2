"""Audio I/O: content types, streaming encoders, resampling, two-pass loudness, guarded decoding.

Module import is light (numpy/soundfile/soxr/av load on first use), so the web
tier can read :data:`FORMATS` and :data:`CONTENT_TYPES`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from synth.errors import AudioRejected, UnsupportedFormat, UnsupportedSampleRate
from synth.registry import FORMATS, G711_FORMATS, OPUS_RATES, RATES_BY_FORMAT, TELEPHONY_RATES

if TYPE_CHECKING:
    import numpy as np

# The one table of MIME types per output format (the API, the OpenAI route and
# downloads all read it through content_type()). ``pcm`` is headerless 16-bit
# little-endian, as OpenAI defines it; ``audio/L16`` (RFC 2586) would promise
# big-endian samples, so the de-facto ``audio/pcm`` is used instead. G.711 bytes without a
# header: ``audio/basic`` is 8 kHz mono μ-law by definition (RFC 2046), ``audio/x-alaw-basic``
# its A-law sibling (the name sox, Asterisk and browsers' media tables use).
CONTENT_TYPES = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "ogg": "audio/ogg",
    "mp3": "audio/mpeg",
    "pcm": "audio/pcm",
    "aac": "audio/aac",
    "ulaw": "audio/basic",
    "alaw": "audio/x-alaw-basic",
}
_FROM_PCM16 = ("wav", "pcm", *G711_FORMATS)  # formats encoded from the 16-bit samples, not the floats
_SOUNDFILE = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "OPUS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
}


def content_type(fmt: str) -> str:
    """The MIME type of audio in ``fmt`` (one of :data:`FORMATS`)."""
    try:
        return CONTENT_TYPES[fmt]
    except KeyError:
        raise UnsupportedFormat(f"unsupported format {fmt!r}; use one of {', '.join(FORMATS)}") from None


def output_rate(fmt: str, requested: int | None, native: int) -> int:
    """The sample rate to encode at: ``requested`` if the format allows it.

    ``None`` means the voice's native rate; for Ogg/Opus, which only runs at
    8/12/16/24/48 kHz, the nearest of those; for G.711 (``ulaw``, ``alaw``) 8 kHz, its only rate.
    """
    if fmt not in FORMATS:
        raise UnsupportedFormat(f"unsupported format {fmt!r}; use one of {', '.join(FORMATS)}")
    allowed = RATES_BY_FORMAT[fmt]
    if requested is None:
        if fmt == "ogg":
            return min(OPUS_RATES, key=lambda r: (abs(r - native), -r))
        if fmt in G711_FORMATS:
            return TELEPHONY_RATES[0]
        return native
    if isinstance(requested, bool) or not isinstance(requested, int) or requested not in allowed:
        raise UnsupportedSampleRate(
            f"sample rate {requested!r} is not available for {fmt}; use one of {', '.join(map(str, allowed))}"
        )
    return requested


def pcm16_samples(audio: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] as little-endian int16, rounded to nearest (as libsndfile does)."""
    import numpy as np

    return np.rint(audio * np.float32(32767.0)).astype("<i2")


class Encoder:
    """Writes float32 mono chunks to ``path`` in ``fmt`` as they arrive."""

    def __init__(
        self, path: str, fmt: str, sample_rate: int, tap: Callable[[bytes], None] | None = None
    ) -> None:
        if fmt not in FORMATS:
            raise UnsupportedFormat(f"unsupported format {fmt!r}")
        if fmt in G711_FORMATS and sample_rate not in TELEPHONY_RATES:
            # Raw G.711 says nothing of its rate: a reader takes 8 kHz, so any other would play wrong.
            raise UnsupportedSampleRate(f"{fmt} is 8000 Hz only, not {sample_rate}")
        self.path = path
        self.tap = tap  # gets every block as 16-bit PCM (the stream file; synth.stream)
        self.format = fmt
        self.sample_rate = sample_rate
        self.frames = 0
        self._sf: Any = None
        self._raw: Any = None
        self._av: Any = None
        self._stream: Any = None
        if fmt in _SOUNDFILE:
            import soundfile as sf

            major, subtype = _SOUNDFILE[fmt]
            self._sf = sf.SoundFile(
                path, "w", samplerate=sample_rate, channels=1, format=major, subtype=subtype
            )
        elif fmt == "pcm" or fmt in G711_FORMATS:
            self._raw = open(path, "wb")
        else:
            import av

            self._av = av.open(path, mode="w", format="adts")
            self._stream = self._av.add_stream("aac", rate=sample_rate)
            self._stream.layout = "mono"

    def write(self, audio: np.ndarray) -> None:
        import numpy as np

        if audio.size == 0:
            return
        audio = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
        # WAV, raw PCM and G.711 get the very samples the tap gets, so a stream of them equals the
        # file (G.711 is companded from those 16-bit samples, as a live encoder does with the tap's).
        pcm16 = pcm16_samples(audio) if self.tap is not None or self.format in _FROM_PCM16 else None
        if pcm16 is not None and self.tap is not None:
            self.tap(pcm16.tobytes())
        if self._sf is not None:
            self._sf.write(pcm16 if self.format == "wav" else audio)
        elif self._raw is not None and pcm16 is not None:
            if self.format in G711_FORMATS:
                from synth import g711

                self._raw.write(g711.encode(pcm16, self.format))
            else:
                self._raw.write(pcm16.tobytes())
        else:
            import av

            frame = av.AudioFrame.from_ndarray(audio.reshape(1, -1), format="flt", layout="mono")
            frame.sample_rate = self.sample_rate
            frame.pts = self.frames
            for packet in self._stream.encode(frame):
                self._av.mux(packet)
        self.frames += int(audio.size)

    def close(self) -> None:
        if self._sf is not None:
            self._sf.close()
            self._sf = None
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        if self._av is not None:
            for packet in self._stream.encode(None):
                self._av.mux(packet)
            self._av.close()
            self._av = None

    def abort(self) -> None:
        """Close without caring about errors (the caller deletes the file)."""
        try:
            self.close()
        except Exception:  # noqa: S110 - the partial file is being thrown away
            pass


class StreamResampler:
    """Chunk-by-chunk resampling with soxr (no seams between chunks)."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream: Any = None
        if in_rate != out_rate:
            import soxr

            self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def process(self, audio: np.ndarray, last: bool = False) -> np.ndarray:
        import numpy as np

        if self._stream is None:
            return audio
        out: np.ndarray = self._stream.resample_chunk(np.asarray(audio, dtype=np.float32), last=last)
        return out


class LoudnessMeter:
    """ITU-R BS.1770 integrated loudness of a stream, in bounded memory.

    Audio is buffered into windows of ``window_seconds``; each full window is
    measured with pyloudnorm's public ``Meter.integrated_loudness`` (400 ms
    blocks, 75 % overlap, -70 LUFS absolute and -10 LU relative gates within
    the window) and only its loudness and length are kept. :meth:`integrated`
    combines the windows as the standard combines blocks: the energy mean of
    the windows above the absolute gate, then again of those within 10 LU of
    that mean. Memory is one window plus the largest chunk added; a window is
    long enough (10 s) that its gating matches a whole-file measurement to a
    fraction of a LU on speech (tests/unit/synth/test_audio.py).
    """

    def __init__(self, rate: int, window_seconds: float = 10.0) -> None:
        import pyloudnorm

        self.rate = rate
        self._meter = pyloudnorm.Meter(rate)
        self._window = max(int(window_seconds * rate), self._min_frames)
        self._pending: list[np.ndarray] = []
        self._pending_frames = 0
        self.windows: list[tuple[float, int]] = []  # (loudness LUFS, frames)

    @property
    def _min_frames(self) -> int:
        return int(self._meter.block_size * self.rate) + 1

    def add(self, audio: np.ndarray) -> None:
        import numpy as np

        if audio.size == 0:
            return
        self._pending.append(np.asarray(audio, dtype=np.float64).reshape(-1))
        self._pending_frames += int(audio.size)
        if self._pending_frames >= self._window:
            self._measure_pending()

    def _measure_pending(self) -> None:
        import numpy as np

        window = np.concatenate(self._pending)
        self._pending, self._pending_frames = [], 0
        if window.size < self._min_frames:
            if self.windows:
                return  # under one gating block at the end of a long stream: no weight worth keeping
            window = np.concatenate([window, np.zeros(self._min_frames - window.size)])
        self.windows.append((float(self._meter.integrated_loudness(window)), int(window.size)))

    def integrated(self) -> float:
        """Integrated loudness (LUFS) of everything added; -inf for silence."""
        if self._pending_frames:
            self._measure_pending()
        audible = [(lk, n) for lk, n in self.windows if math.isfinite(lk) and lk >= ABSOLUTE_GATE_LUFS]
        if not audible:
            return float("-inf")
        relative_gate = _energy_mean(audible) - 10.0
        return _energy_mean([(lk, n) for lk, n in audible if lk > relative_gate])


ABSOLUTE_GATE_LUFS = -70.0


def _energy_mean(windows: list[tuple[float, int]]) -> float:
    """The loudness of windows played one after another, weighted by length."""
    total = sum(n for _, n in windows)
    energy = sum(n * 10 ** ((lk + 0.691) / 10.0) for lk, n in windows) / total
    return -0.691 + 10.0 * math.log10(energy)


def write_normalized(
    blocks: Iterable[np.ndarray],
    write: Callable[[np.ndarray], None],
    rate: int,
    target: float,
    spool_path: str,
    before_block: Callable[[], None] | None = None,
) -> float:
    """Write ``blocks`` to ``write`` with one gain that brings them to ``target`` LUFS.

    Integrated loudness is a property of the whole programme, so the gain is
    known only at the end: pass 1 spools the float32 audio to ``spool_path``
    (disk, not memory) while a :class:`LoudnessMeter` measures it; pass 2
    reads it back a few seconds at a time and applies the gain with
    ``pyloudnorm.normalize.loudness``. A constant gain keeps the dynamics as
    synthesised (a running gain would pump between sentences). Memory stays
    bounded whatever the length; the spool is removed here. ``before_block``
    runs before each pass-2 block (a cancel check). Returns the measured
    loudness (-inf for silence, which is written unchanged).
    """
    import warnings

    import numpy as np
    import pyloudnorm

    meter = LoudnessMeter(rate)
    try:
        with open(spool_path, "wb") as fh:
            for block in blocks:
                meter.add(block)
                fh.write(np.asarray(block, dtype=np.float32).tobytes())
        measured = meter.integrated()
        with open(spool_path, "rb") as fh:
            while True:
                if before_block is not None:
                    before_block()
                block = np.frombuffer(fh.read(rate * 4 * 4), dtype=np.float32)
                if block.size == 0:
                    break
                if math.isfinite(measured):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # "possible clipped samples": the encoder clips
                        block = pyloudnorm.normalize.loudness(block, measured, target).astype(np.float32)
                write(block)
    finally:
        try:
            os.remove(spool_path)
        except FileNotFoundError:
            pass
    return measured


def loudness_of(audio: np.ndarray, rate: int) -> float:
    """Integrated loudness of a whole array (pyloudnorm), for checks and tests."""
    import pyloudnorm

    return float(pyloudnorm.Meter(rate).integrated_loudness(audio))


# --------------------------------------------------------------------------- decoding uploads


# The FFmpeg demuxer for each type synth.prompt sniffs: a file is never probed, so a
# playlist or a concat script behind an audio tag never reaches the demuxer that follows it.
# "mpeg" (a bare frame sync) is MP3 or ADTS AAC.
_DEMUXERS: dict[str, tuple[str, ...]] = {
    "wav": ("wav",),
    "flac": ("flac",),
    "ogg": ("ogg",),
    "mp3": ("mp3",),
    "mpeg": ("mp3", "aac"),
    "aiff": ("aiff",),
    "mp4": ("mov",),
    "webm": ("matroska",),
}
# Only local files: no http, no data, no concat or subfile protocol.
_AV_OPTIONS = {"protocol_whitelist": "file"}


def decode_upload(
    path: str, max_seconds: float, max_bytes: int, min_rate: int = 0, container: str | None = None
) -> tuple[np.ndarray, int]:
    """Decode an uploaded audio file to mono float32, refusing oversize input.

    The file size is checked first, then the duration the header declares
    (so a tiny file that would decode to hours is refused without decoding),
    then the decoded length while reading (headers can lie). Each refusal
    carries its own code (synth.prompt lists them) so the API can answer
    413/415/400 without reading messages. ``container`` (what synth.prompt
    sniffed) names the FFmpeg demuxers that may open it; without one FFmpeg
    probes the file, as for the engines' own audio.
    """
    import numpy as np

    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise _rejected(f"cannot read the uploaded file: {exc}", "invalid_audio") from exc
    if size > max_bytes:
        raise _rejected(f"the file is {size} bytes; the limit is {max_bytes}", "upload_too_large")
    if size == 0:
        raise _rejected("the file is empty", "invalid_audio")
    import soundfile as sf

    try:
        handle = sf.SoundFile(path)
    except Exception:
        return _decode_with_av(path, max_seconds, min_rate, container)
    with handle:
        sr = _checked_rate(int(handle.samplerate), min_rate)
        cap = int(max_seconds * sr)
        if handle.frames > cap:
            raise _rejected(
                f"the audio lasts {handle.frames / sr:.1f} s; the limit is {max_seconds:g} s",
                "audio_too_long",
            )
        blocks: list[np.ndarray] = []
        total = 0
        for block in handle.blocks(blocksize=sr, dtype="float32", always_2d=True):
            total += block.shape[0]
            if total > cap:
                raise _rejected(f"the audio lasts more than {max_seconds:g} s", "audio_too_long")
            blocks.append(block.mean(axis=1).astype(np.float32))
    if not blocks:
        raise _rejected("the file holds no audio", "invalid_audio")
    return np.concatenate(blocks), sr


def _rejected(message: str, reason: str) -> AudioRejected:
    """An AudioRejected (code ``audio_rejected``) that names which limit it was, for synth.prompt."""
    error = AudioRejected(message)
    error.reason = reason
    return error


def _checked_rate(rate: int, min_rate: int) -> int:
    if rate <= 0:
        raise _rejected("the file declares no sample rate", "invalid_audio")
    if rate < min_rate:
        raise _rejected(
            f"the sample rate is {rate} Hz; at least {min_rate} Hz is needed", "sample_rate_too_low"
        )
    return rate


def _open_av(path: str, sniffed: str | None) -> Any:
    import av

    if sniffed is None:
        return av.open(path, options=dict(_AV_OPTIONS))
    error: Exception | None = None
    for demuxer in _DEMUXERS.get(sniffed, ()):
        try:
            return av.open(path, format=demuxer, options=dict(_AV_OPTIONS))
        except Exception as exc:
            error = exc
    raise error or ValueError(f"no demuxer for {sniffed!r}")


def _decode_with_av(
    path: str, max_seconds: float, min_rate: int = 0, sniffed: str | None = None
) -> tuple[np.ndarray, int]:
    import av
    import numpy as np

    try:
        container = _open_av(path, sniffed)
    except Exception as exc:
        raise _rejected(f"not a readable audio file: {exc}", "unsupported_media_type") from exc
    with container:
        streams = container.streams.audio
        if not streams:
            raise _rejected("the file holds no audio stream", "unsupported_media_type")
        stream = streams[0]
        if container.duration is not None and container.duration / 1_000_000 > max_seconds:
            raise _rejected(
                f"the audio lasts {container.duration / 1_000_000:.1f} s; the limit is {max_seconds:g} s",
                "audio_too_long",
            )
        sr = _checked_rate(int(stream.rate or stream.codec_context.sample_rate or 0), min_rate)
        cap = int(max_seconds * sr)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=sr)
        out: list[np.ndarray] = []
        total = 0
        try:
            for frame in container.decode(stream):
                for rf in resampler.resample(frame):
                    arr = rf.to_ndarray().reshape(-1).astype(np.float32)
                    total += arr.size
                    if total > cap:
                        raise _rejected(f"the audio lasts more than {max_seconds:g} s", "audio_too_long")
                    out.append(arr)
        except AudioRejected:
            raise
        except Exception as exc:
            raise _rejected(f"the audio could not be decoded: {exc}", "invalid_audio") from exc
    if not out:
        raise _rejected("the file holds no audio", "invalid_audio")
    return np.concatenate(out), sr


__all__ = [
    "CONTENT_TYPES",
    "FORMATS",
    "Encoder",
    "LoudnessMeter",
    "StreamResampler",
    "content_type",
    "decode_upload",
    "loudness_of",
    "write_normalized",
    "output_rate",
]
