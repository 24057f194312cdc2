"""Audio I/O: streaming encoders, resampling, two-pass loudness, guarded decoding.

Module import is light (numpy/soundfile/soxr/av load on first use), so the web
tier can read :data:`FORMATS` and :data:`CONTENT_TYPES`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from synth.errors import AudioRejected, UnsupportedFormat, UnsupportedSampleRate
from synth.registry import FORMATS, OPUS_RATES, RATES_BY_FORMAT

if TYPE_CHECKING:
    import numpy as np

CONTENT_TYPES = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "ogg": "audio/ogg",
    "mp3": "audio/mpeg",
    "pcm": "audio/L16",
    "aac": "audio/aac",
}
EXTENSIONS = {"wav": "wav", "flac": "flac", "ogg": "ogg", "mp3": "mp3", "pcm": "pcm", "aac": "aac"}
_SOUNDFILE = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "OPUS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
}


def output_rate(fmt: str, requested: int | None, native: int) -> int:
    """The sample rate to encode at: ``requested`` if the format allows it.

    ``None`` means the voice's native rate; for Ogg/Opus, which only runs at
    8/12/16/24/48 kHz, the nearest of those.
    """
    if fmt not in FORMATS:
        raise UnsupportedFormat(f"unsupported format {fmt!r}; use one of {', '.join(FORMATS)}")
    allowed = RATES_BY_FORMAT[fmt]
    if requested is None:
        if fmt == "ogg":
            return min(OPUS_RATES, key=lambda r: (abs(r - native), -r))
        return native
    if isinstance(requested, bool) or not isinstance(requested, int) or requested not in allowed:
        raise UnsupportedSampleRate(
            f"sample rate {requested!r} is not available for {fmt}; use one of {', '.join(map(str, allowed))}"
        )
    return requested


class Encoder:
    """Writes float32 mono chunks to ``path`` in ``fmt`` as they arrive."""

    def __init__(self, path: str, fmt: str, sample_rate: int) -> None:
        if fmt not in FORMATS:
            raise UnsupportedFormat(f"unsupported format {fmt!r}")
        self.path = path
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
        elif fmt == "pcm":
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
        if self._sf is not None:
            self._sf.write(audio)
        elif self._raw is not None:
            self._raw.write((audio * 32767.0).astype("<i2").tobytes())
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


def resample(audio: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """One-shot resampling of a whole array."""
    import numpy as np
    import soxr

    if in_rate == out_rate:
        return audio
    out: np.ndarray = soxr.resample(np.asarray(audio, dtype=np.float32), in_rate, out_rate)
    return out


class LoudnessMeter:
    """ITU-R BS.1770 integrated loudness measured incrementally.

    pyloudnorm's K-weighting filters run with carried state; per 100 ms step we
    keep one energy sum, so memory is 10 floats per second of audio whatever
    the length. Blocks are 400 ms with 75 % overlap, gated at -70 LUFS and
    -10 LU relative, as in pyloudnorm.Meter.integrated_loudness.
    """

    def __init__(self, rate: int) -> None:
        import numpy as np
        import pyloudnorm

        meter = pyloudnorm.Meter(rate)
        self.rate = rate
        self._stages: list[list[Any]] = []
        for stage in meter._filters.values():
            b, a = np.asarray(stage.b, dtype=np.float64), np.asarray(stage.a, dtype=np.float64)
            self._stages.append([b, a, float(stage.passband_gain), np.zeros(max(len(a), len(b)) - 1)])
        self._step = max(1, int(round(0.1 * rate)))
        self._partial = 0.0
        self._partial_n = 0
        self.steps: list[float] = []

    def add(self, audio: np.ndarray) -> None:
        import numpy as np
        from scipy.signal import lfilter

        x = np.asarray(audio, dtype=np.float64)
        for stage in self._stages:
            b, a, gain, zi = stage
            y, stage[3] = lfilter(b, a, x, zi=zi)
            x = gain * y
        sq = x * x
        i = 0
        n = sq.size
        while i < n:
            take = min(self._step - self._partial_n, n - i)
            self._partial += float(sq[i : i + take].sum())
            self._partial_n += take
            i += take
            if self._partial_n == self._step:
                self.steps.append(self._partial)
                self._partial, self._partial_n = 0.0, 0

    def integrated(self) -> float:
        import numpy as np

        steps = np.asarray(self.steps, dtype=np.float64)
        if steps.size < 4:
            return float("-inf")
        block = steps[:-3] + steps[1:-2] + steps[2:-1] + steps[3:]
        z = block / (4 * self._step)
        with np.errstate(divide="ignore"):
            lk = -0.691 + 10.0 * np.log10(z)
        gated = z[lk >= -70.0]
        if gated.size == 0:
            return float("-inf")
        rel = -0.691 + 10.0 * np.log10(gated.mean()) - 10.0
        final = z[(lk >= -70.0) & (lk > rel)]
        if final.size == 0:
            return float("-inf")
        return float(-0.691 + 10.0 * np.log10(final.mean()))


def loudness_of(audio: np.ndarray, rate: int) -> float:
    """Integrated loudness of a whole array (pyloudnorm), for checks and tests."""
    import pyloudnorm

    return float(pyloudnorm.Meter(rate).integrated_loudness(audio))


# --------------------------------------------------------------------------- decoding uploads


def decode_upload(path: str, max_seconds: float, max_bytes: int) -> tuple[np.ndarray, int]:
    """Decode an uploaded audio file to mono float32, refusing oversize input.

    The file size is checked first, then the duration the header declares
    (so a tiny file that would decode to hours is refused without decoding),
    then the decoded length while reading (headers can lie).
    """
    import numpy as np

    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise AudioRejected(f"cannot read the uploaded file: {exc}") from exc
    if size > max_bytes:
        raise AudioRejected(f"the file is {size} bytes; the limit is {max_bytes}")
    if size == 0:
        raise AudioRejected("the file is empty")
    import soundfile as sf

    try:
        handle = sf.SoundFile(path)
    except Exception:
        return _decode_with_av(path, max_seconds)
    with handle:
        sr = int(handle.samplerate)
        if sr <= 0:
            raise AudioRejected("the file declares no sample rate")
        cap = int(max_seconds * sr)
        if handle.frames > cap:
            raise AudioRejected(f"the audio lasts {handle.frames / sr:.1f} s; the limit is {max_seconds:g} s")
        blocks: list[np.ndarray] = []
        total = 0
        for block in handle.blocks(blocksize=sr, dtype="float32", always_2d=True):
            total += block.shape[0]
            if total > cap:
                raise AudioRejected(f"the audio lasts more than {max_seconds:g} s")
            blocks.append(block.mean(axis=1).astype(np.float32))
    if not blocks:
        raise AudioRejected("the file holds no audio")
    return np.concatenate(blocks), sr


def _decode_with_av(path: str, max_seconds: float) -> tuple[np.ndarray, int]:
    import av
    import numpy as np

    try:
        container = av.open(path)
    except Exception as exc:
        raise AudioRejected(f"not a readable audio file: {exc}") from exc
    with container:
        streams = container.streams.audio
        if not streams:
            raise AudioRejected("the file holds no audio stream")
        stream = streams[0]
        if container.duration is not None and container.duration / 1_000_000 > max_seconds:
            raise AudioRejected(
                f"the audio lasts {container.duration / 1_000_000:.1f} s; the limit is {max_seconds:g} s"
            )
        sr = int(stream.rate or stream.codec_context.sample_rate or 0)
        if sr <= 0:
            raise AudioRejected("the file declares no sample rate")
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
                        raise AudioRejected(f"the audio lasts more than {max_seconds:g} s")
                    out.append(arr)
        except AudioRejected:
            raise
        except Exception as exc:
            raise AudioRejected(f"the audio could not be decoded: {exc}") from exc
    if not out:
        raise AudioRejected("the file holds no audio")
    return np.concatenate(out), sr


__all__ = [
    "CONTENT_TYPES",
    "FORMATS",
    "Encoder",
    "LoudnessMeter",
    "StreamResampler",
    "decode_upload",
    "loudness_of",
    "output_rate",
    "resample",
]
