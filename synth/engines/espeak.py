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
from synth.normalize import escape_markup_mapped, is_chinese_language, normalize_mapped
from synth.registry import ESPEAK_PREFIX, VoiceInfo, engine_capabilities, list_voices
from synth.text import is_speakable, iter_segments
from synth.timestamps import WordTiming, scaled, timing

if TYPE_CHECKING:
    import numpy as np

MIN_RATE = 80
MAX_RATE = 1000
_CHINESE_VOICES = ("cmn", "yue", "hak", "nan", "wuu", "cmn-latn-pinyin")


class EspeakEngine:
    name = "espeak"
    word_timings = True  # synthesize() fills ``timings`` from eSpeak's word events (synth.timestamps)

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
        return self.render_spans(sentence, params)[0]

    def render_spans(self, sentence: str, params: VoiceParams) -> tuple[str, list[tuple[int, int]]]:
        """:meth:`render`, and per character of it the span of ``sentence`` it came from."""
        short = self.short_name(params.voice)
        lib = get_lib()
        chinese_voice = short in _CHINESE_VOICES or short.startswith("cmn")
        language = params.language or ("zh" if chinese_voice else short)
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        for seg in iter_segments(sentence):
            if seg.kind == "text":
                lang = "zh" if (is_chinese_language(language) or chinese_voice) else language
                mapped = escape_markup_mapped(normalize_mapped(seg.text, lang, seg.start))
                parts.append(mapped.text)
                spans.extend(mapped.spans)
                continue
            if seg.kind == "arpabet":
                part = f" [[{arpabet_to(seg.tokens, ARPABET_ESPEAK, chr(39), ',')}]] "
            else:
                ph = lib.text_to_phonemes(" ".join(seg.tokens), "cmn" if short != "yue" else "cmn")
                ph = re.sub(r"[_|\s]+", " ", ph).strip()
                part = f"[[{ph}]]" if ph else " "
            parts.append(part)
            spans.extend([(seg.start, seg.start + len(seg.text))] * len(part))  # the annotation is one word
        return "".join(parts), spans

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
        timings: list[list[WordTiming]] | None = None,
    ) -> Iterator[np.ndarray]:
        """``timings``, when given, gets each chunk's word timings (synth.timestamps) before its audio."""
        import numpy as np

        lib = get_lib()
        short = self.short_name(params.voice)
        lib.voice(short)  # raises UnknownVoice
        rate = min(max(self.rate_for(params), MIN_RATE), MAX_RATE)
        done = 0
        for chunk in chunks:
            check_cancel(should_cancel)
            text, spans = self.render_spans(chunk, params)
            events: list[tuple[int, int, int]] | None = [] if timings is not None else None
            pcm = lib.synth(text, short, rate=rate, phonemes=True, words=events)
            raw = np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768.0
            audio = pitch_shift_resample(raw, params.pitch, lib.sample_rate)
            if timings is not None:
                words = word_timings(text, spans, events or [], raw, lib.sample_rate)
                timings.append(scaled(words, len(audio) / len(raw) if len(raw) else 1.0))
            yield apply_gain_db(audio, params.volume)
            done += 1
            if progress is not None:
                progress(done, total if total is not None else done)


def word_timings(
    text: str, spans: list[tuple[int, int]], events: list[tuple[int, int, int]], audio: np.ndarray, rate: int
) -> list[WordTiming]:
    """Word timings from eSpeak's word events: a word starts at its event and ends where its sound
    does before the next word's (eSpeak says where words start only; the pause after a comma is
    trimmed by energy, 10 ms frames under -35 dB of the sentence's loudest)."""
    import numpy as np

    frame = max(1, rate // 100)
    usable = len(audio) // frame * frame
    rms = np.sqrt(np.mean(audio[:usable].reshape(-1, frame) ** 2, axis=1)) if usable else np.zeros(0)
    loud = rms > (rms.max() * 10 ** (-35 / 20) if rms.size else 0.0)
    duration = len(audio) / rate
    starts = [min(ms / 1000.0, duration) for _, _, ms in events]
    out: list[WordTiming] = []
    last = 0.0
    for k, (position, length, _) in enumerate(events):
        begin = max(position - 1, 0)
        # A word runs to the next one's start, less the spaces and punctuation before it: eSpeak's
        # length covers "forty" of "forty-two" and one character of a Chinese word.
        stop = max(events[k + 1][0] - 1, begin + 1) if k + 1 < len(events) else len(text)
        stop = min(max(stop, begin + max(length, 1)), len(text))
        while stop > begin + max(length, 1) and not is_speakable(text[stop - 1]) and text[stop - 1] != "]":
            stop -= 1
        while begin < stop - 1 and not is_speakable(text[begin]) and text[begin] != "[":
            begin += 1  # eSpeak may start a word at the dash or quote before it
        if begin >= len(text) or begin >= stop:
            continue
        limit = starts[k + 1] if k + 1 < len(events) else duration
        start = max(starts[k], last)
        first_frame, end_frame = int(start * 100), int(limit * 100)
        sounding = np.flatnonzero(loud[first_frame:end_frame])
        end = min((first_frame + int(sounding[-1]) + 1) / 100.0, limit) if sounding.size else limit
        chars = spans[begin:stop]
        word = text[begin:stop].strip().strip("[]").strip()  # an annotation: its phonemes
        if not word or not chars:
            continue
        out.append(timing(word, start, max(end, start), min(s for s, _ in chars), max(e for _, e in chars)))
        last = max(end, start)
    return out
