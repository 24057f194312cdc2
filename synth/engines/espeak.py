"""eSpeak NG 1.52 (from ``espeakng-loader``) through ctypes: 100+ languages incl. cmn and yue."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from synth.engines.base import (
    ARPABET_ESPEAK,
    CancelFn,
    ProgressFn,
    VoiceParams,
    apply_gain_db,
    arpabet_to,
    check_cancel,
    pitch_shift_resample,
    resolve_device,
)
from synth.errors import EngineUnavailable, UnknownVoice
from synth.espeak_lib import DEFAULT_RATE, get_lib
from synth.normalize import escape_markup, is_chinese_language, normalize
from synth.registry import ESPEAK_PREFIX, VoiceInfo, engine_capabilities, list_voices
from synth.text import iter_segments

if TYPE_CHECKING:
    import numpy as np

MIN_RATE = 80
MAX_RATE = 1000
_CHINESE_VOICES = ("cmn", "yue", "hak", "nan", "wuu", "cmn-latn-pinyin")


class EspeakEngine:
    name = "espeak"

    def __init__(self, voices_dir: str | None = None, threads: int | None = None) -> None:
        self.device = "cpu"
        self._infos: dict[str, VoiceInfo] = {}

    def load(self, device: str = "cpu", voice_ids: list[str] | None = None) -> None:
        dev = resolve_device(device)
        if dev != "cpu" and device != "auto":
            raise EngineUnavailable("eSpeak NG runs on the CPU only; use device='cpu' or 'auto'")
        self.device = "cpu"
        get_lib()
        self._infos = {v.id: v for v in list_voices(None, ["espeak"])}

    def voices(self) -> list[VoiceInfo]:
        if not self._infos:
            self._infos = {v.id: v for v in list_voices(None, ["espeak"])}
        return list(self._infos.values())

    def capabilities(self) -> dict[str, Any]:
        return engine_capabilities(
            "espeak", sorted({lang for v in self.voices() for lang in v.capabilities["languages"]})
        )

    def sample_rate(self, voice: str) -> int:
        return get_lib().sample_rate

    @staticmethod
    def short_name(voice: str) -> str:
        if not voice.startswith(ESPEAK_PREFIX):
            raise UnknownVoice(f"{voice!r} is not an eSpeak voice")
        return voice[len(ESPEAK_PREFIX) :]

    def rate_for(self, params: VoiceParams) -> int:
        factor = 2 ** (params.pitch / 12.0)
        return int(round(DEFAULT_RATE * params.speed / factor))

    def notes(self, params: VoiceParams) -> list[str]:
        """Controls that eSpeak can only approximate for these parameters."""
        rate = self.rate_for(params)
        if rate < MIN_RATE:
            return [f"speed {params.speed:g}: eSpeak's slowest rate is {MIN_RATE} wpm, used that"]
        if rate > MAX_RATE:
            return [f"speed {params.speed:g}: eSpeak's fastest rate is {MAX_RATE} wpm, used that"]
        return []

    def render(self, sentence: str, params: VoiceParams) -> str:
        short = self.short_name(params.voice)
        lib = get_lib()
        chinese_voice = short in _CHINESE_VOICES or short.startswith("cmn")
        language = params.language or ("zh" if chinese_voice else short)
        parts: list[str] = []
        for seg in iter_segments(sentence):
            if seg.kind == "text":
                lang = "zh" if (is_chinese_language(language) or chinese_voice) else language
                parts.append(escape_markup(normalize(seg.text, lang)))
            elif seg.kind == "arpabet":
                parts.append(f" [[{arpabet_to(seg.tokens, ARPABET_ESPEAK, chr(39), ',')}]] ")
            else:
                ph = lib.text_to_phonemes(" ".join(seg.tokens), "cmn" if short != "yue" else "cmn")
                ph = re.sub(r"[_|\s]+", " ", ph).strip()
                parts.append(f"[[{ph}]]" if ph else " ")
        return "".join(parts)

    def phonemes(self, text: str, params: VoiceParams) -> list[str]:
        """eSpeak's phonemes (its mnemonics) for ``text`` as this request would speak it."""
        rendered = self.render(text, params)
        short = self.short_name(params.voice)
        out: list[str] = []
        for part in re.split(r"(\[\[.*?\]\])", rendered):
            if part.startswith("[["):
                out.extend(part[2:-2].split())
            elif part.strip():
                out.extend(get_lib().text_to_phonemes(part, short).split())
        return out

    def synthesize(
        self,
        chunks: Iterable[str],
        params: VoiceParams,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        total: int | None = None,
    ) -> Iterator[np.ndarray]:
        import numpy as np

        lib = get_lib()
        short = self.short_name(params.voice)
        lib.voice(short)  # raises UnknownVoice
        rate = min(max(self.rate_for(params), MIN_RATE), MAX_RATE)
        done = 0
        for chunk in chunks:
            check_cancel(should_cancel)
            text = self.render(chunk, params)
            pcm = lib.synth(text, short, rate=rate, phonemes=True)
            audio = np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768.0
            audio = pitch_shift_resample(audio, params.pitch, lib.sample_rate)
            yield apply_gain_db(audio, params.volume)
            done += 1
            if progress is not None:
                progress(done, total if total is not None else done)
