"""The engine protocol every synthesis backend implements."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from synth.registry import CAPABILITY_DEFAULTS, EngineOptions

if TYPE_CHECKING:
    import numpy as np

    from synth.registry import VoiceInfo

__all__ = ["CAPABILITY_DEFAULTS", "EngineOptions", "EnginePlugin"]  # re-exported for plugin authors

ProgressFn = Callable[[int, int], None]
CancelFn = Callable[[], bool]

DEVICES_HELP = "cpu, cuda, cuda:N or auto"


@dataclass(frozen=True)
class VoicePrompt:
    """What an engine with the ``cloning`` capability clones from (an uploaded voice).

    ``audio_path`` is the canonical prompt (mono WAV, synth.prompt); engines
    without the capability never receive one (the service refuses ``zero_shot``).
    """

    audio_path: str
    sample_rate: int
    transcript: str = ""
    embedding: tuple[float, ...] = ()
    # The voice's stable id, for an engine that keeps the voice on its upstream (a remote model
    # that registers voices); "": never kept there (a request's one-off reference audio).
    key: str = ""
    consent: str = ""  # the id of the consent the voice is cloned under


@dataclass
class VoiceParams:
    """Absolute controls for one request, already merged with any instructions."""

    voice: str
    speed: float = 1.0  # 1.0 = natural rate
    pitch: float = 0.0  # semitones
    volume: float = 0.0  # dB
    language: str | None = None  # text language override (for normalisation / eSpeak voice)
    noise_scale: float | None = None
    noise_w: float | None = None
    seed: int | None = None  # noise seed (the torch runtime; onnxruntime draws its own)
    prompt: VoicePrompt | None = None  # zero-shot cloning, for engines that can


class Pieces:
    """One chunk's audio as it comes, in parts (float32 mono arrays): what an engine that receives
    a sentence's audio over time (a remote model's stream) yields for the chunk instead of one
    array, so that the first part reaches listeners before the chunk's last. The synthesizer
    writes each part as it comes and counts the chunk done after its last."""

    def __init__(self, parts: Iterator[np.ndarray]) -> None:
        self._parts = parts

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._parts


@runtime_checkable
class Engine(Protocol):
    """A loaded synthesis backend.

    ``synthesize`` takes sentence chunks (raw request text, annotations
    included) and yields one float32 mono array per chunk at
    ``sample_rate(voice)``, or a :class:`Pieces` of the chunk's parts as they
    come. Between chunks it calls ``should_cancel`` and raises
    :class:`synth.errors.Cancelled` when it returns True, and reports
    ``progress(done, total)``.
    """

    name: str
    device: str

    def load(self, device: str = "cpu", voice_ids: list[str] | None = None) -> None: ...

    def voices(self) -> list[VoiceInfo]: ...

    def capabilities(self) -> dict[str, Any]: ...

    def sample_rate(self, voice: str) -> int: ...

    def phonemes(self, text: str, params: VoiceParams) -> list[str]: ...

    def notes(self, params: VoiceParams) -> list[str]:
        """Controls this engine can only approximate for ``params`` (reported as not applied)."""
        ...

    def synthesize(
        self,
        chunks: Iterable[str],
        params: VoiceParams,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        total: int | None = None,
    ) -> Iterator[np.ndarray | Pieces]: ...


@runtime_checkable
class EnginePlugin(Protocol):
    """What an entry point of the group ``tts_service.engines`` names (docs/engines.md).

    ``voices`` and ``capabilities`` answer without loading a model (the worker lists them
    before it loads, the analysis worker to pick candidates); ``create`` builds the
    :class:`Engine`, which the worker then loads on its device.
    """

    def voices(self, options: EngineOptions) -> list[VoiceInfo]: ...

    def capabilities(self, options: EngineOptions) -> dict[str, Any]: ...

    def create(self, options: EngineOptions) -> Engine: ...


def _onnxruntime_has_cuda() -> bool:
    try:
        import onnxruntime
    except ImportError:
        return False
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def resolve_device(device: str, has_cuda: Callable[[], bool] = _onnxruntime_has_cuda) -> str:
    """Normalise a device string; ``auto`` picks CUDA when ``has_cuda()`` (default: onnxruntime offers it)."""
    from synth.errors import EngineUnavailable

    d = (device or "cpu").strip().lower()
    if d == "auto":
        return "cuda:0" if has_cuda() else "cpu"
    if d == "cpu":
        return d
    if d == "cuda":
        return "cuda:0"
    if d.startswith("cuda:") and d[5:].isdigit():
        return d
    raise EngineUnavailable(f"unknown device {device!r}; use {DEVICES_HELP}")


def apply_gain_db(audio: np.ndarray, db: float) -> np.ndarray:
    import numpy as np

    if not db:
        return audio
    out: np.ndarray = np.clip(audio * float(10 ** (db / 20.0)), -1.0, 1.0).astype(np.float32)
    return out


def pitch_shift_resample(audio: np.ndarray, semitones: float, sample_rate: int) -> np.ndarray:
    """Raise/lower pitch by resampling; the caller stretched the duration by the same factor."""
    import numpy as np
    import soxr

    if not semitones or audio.size == 0:
        return audio
    factor = 2 ** (semitones / 12.0)
    out: np.ndarray = soxr.resample(audio, sample_rate * factor, sample_rate).astype(np.float32)
    return out


def check_cancel(should_cancel: CancelFn | None) -> None:
    from synth.errors import Cancelled

    if should_cancel is not None and should_cancel():
        raise Cancelled()


# ARPAbet -> IPA (as eSpeak writes it for en-us, which is what Piper voices were trained on).
ARPABET_IPA = {
    "AA": "ɑː",
    "AE": "æ",
    "AH": "ʌ",
    "AO": "ɔː",
    "AW": "aʊ",
    "AY": "aɪ",
    "EH": "ɛ",
    "ER": "ɜː",
    "EY": "eɪ",
    "IH": "ɪ",
    "IY": "iː",
    "OW": "oʊ",
    "OY": "ɔɪ",
    "UH": "ʊ",
    "UW": "uː",
    "B": "b",
    "CH": "tʃ",
    "D": "d",
    "DH": "ð",
    "F": "f",
    "G": "ɡ",
    "HH": "h",
    "JH": "dʒ",
    "K": "k",
    "L": "l",
    "M": "m",
    "N": "n",
    "NG": "ŋ",
    "P": "p",
    "R": "ɹ",
    "S": "s",
    "SH": "ʃ",
    "T": "t",
    "TH": "θ",
    "V": "v",
    "W": "w",
    "Y": "j",
    "Z": "z",
    "ZH": "ʒ",
}
# ARPAbet -> eSpeak's own English phoneme mnemonics (for [[...]] input).
ARPABET_ESPEAK = {
    "AA": "A:",
    "AE": "a",
    "AH": "V",
    "AO": "O:",
    "AW": "aU",
    "AY": "aI",
    "EH": "E",
    "ER": "3:",
    "EY": "eI",
    "IH": "I",
    "IY": "i:",
    "OW": "oU",
    "OY": "OI",
    "UH": "U",
    "UW": "u:",
    "B": "b",
    "CH": "tS",
    "D": "d",
    "DH": "D",
    "F": "f",
    "G": "g",
    "HH": "h",
    "JH": "dZ",
    "K": "k",
    "L": "l",
    "M": "m",
    "N": "n",
    "NG": "N",
    "P": "p",
    "R": "r",
    "S": "s",
    "SH": "S",
    "T": "t",
    "TH": "T",
    "V": "v",
    "W": "w",
    "Y": "j",
    "Z": "z",
    "ZH": "Z",
}


def arpabet_to(tokens: Iterable[str], table: dict[str, str], primary: str, secondary: str) -> str:
    """Render ARPAbet tokens, putting stress marks before stressed vowels."""
    out = []
    for tok in tokens:
        stress = tok[-1] if tok[-1] in "012" else ""
        base = tok[:-1] if stress else tok
        if stress == "1":
            out.append(primary)
        elif stress == "2":
            out.append(secondary)
        if base == "AH" and stress == "0":
            out.append("ə" if table is ARPABET_IPA else "@")
        elif base == "ER" and stress == "0":
            out.append("ɚ" if table is ARPABET_IPA else "3")
        else:
            out.append(table[base])
    return "".join(out)
