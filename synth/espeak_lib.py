"""ctypes binding to eSpeak NG 1.52 from the ``espeakng-loader`` wheel.

The library keeps global state (one voice, one set of parameters, one
callback), so every call goes through :data:`LOCK` and every synthesis sets
all parameters it depends on; nothing from an earlier request leaks into the
next one.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

from synth.errors import EngineUnavailable, UnknownVoice

AUDIO_OUTPUT_SYNCHRONOUS = 2
CHARS_UTF8 = 1
PHONEMES_INPUT = 0x100  # espeakPHONEMES: honour [[...]] (only ever our own, escaped input otherwise)
ENDPAUSE = 0x1000
POS_CHARACTER = 1

PARAM_RATE = 1
PARAM_VOLUME = 2
PARAM_PITCH = 3
PARAM_RANGE = 4
PARAM_PUNCTUATION = 5
PARAM_CAPITALS = 6
PARAM_WORDGAP = 7

DEFAULT_RATE = 175
DEFAULT_PITCH = 50
DEFAULT_RANGE = 50
DEFAULT_VOLUME = 100

LOCK = threading.RLock()

EVENT_LIST_TERMINATED = 0
EVENT_WORD = 1


class _Event(ctypes.Structure):
    """espeak_EVENT (speak_lib.h): what the callback is told about the audio it is handed."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # characters from the start of the input, counted from 1
        ("length", ctypes.c_int),  # the word's characters
        ("audio_position", ctypes.c_int),  # milliseconds from the start of the audio
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),  # a union of int, char* and char[8]: 8 bytes
    ]


_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


class _Voice(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_void_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


@dataclass(frozen=True)
class EspeakVoice:
    name: str
    identifier: str  # e.g. "sit/cmn"
    languages: tuple[str, ...]
    gender: int

    @property
    def short(self) -> str:
        return self.identifier.rsplit("/", 1)[-1]


class EspeakLib:
    """The process-wide eSpeak NG instance."""

    def __init__(self) -> None:
        try:
            import espeakng_loader

            self._lib = ctypes.CDLL(espeakng_loader.get_library_path())
            data_path = espeakng_loader.get_data_path()
        except (ImportError, OSError, RuntimeError) as exc:
            raise EngineUnavailable(f"eSpeak NG library is not available: {exc}") from exc
        lib = self._lib
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_CALLBACK]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_ListVoices.argtypes = [ctypes.c_void_p]
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
        lib.espeak_Synchronize.restype = ctypes.c_int
        with LOCK:
            rate = lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 500, data_path.encode(), 0)
            if rate <= 0:
                raise EngineUnavailable(f"eSpeak NG failed to initialise with data at {data_path}")
            self.sample_rate = int(rate)
            self._chunks: list[bytes] = []
            self._words: list[tuple[int, int, int]] | None = None  # (position, length, ms) of a synth()
            self._callback = _CALLBACK(self._on_audio)  # keep a reference: C holds the pointer
            lib.espeak_SetSynthCallback(self._callback)
            self._voices = self._list_voices()
        self._by_short = {v.short.lower(): v for v in self._voices}

    def _on_audio(self, wav: Any, numsamples: int, events: Any) -> int:
        if numsamples > 0 and wav:
            self._chunks.append(ctypes.string_at(wav, numsamples * 2))
        if self._words is not None and events:
            i = 0
            while events[i].type != EVENT_LIST_TERMINATED and i < 10_000:
                if events[i].type == EVENT_WORD:
                    e = events[i]
                    self._words.append((int(e.text_position), int(e.length), int(e.audio_position)))
                i += 1
        return 0

    def _list_voices(self) -> list[EspeakVoice]:
        out: list[EspeakVoice] = []
        arr = self._lib.espeak_ListVoices(None)
        i = 0
        while arr[i]:
            v = arr[i].contents
            ident = (v.identifier or b"").decode()
            langs: list[str] = []
            p = v.languages
            if p:
                off = 0
                while True:
                    prio = ctypes.c_ubyte.from_address(p + off).value
                    if prio == 0:
                        break
                    s = ctypes.string_at(p + off + 1)
                    langs.append(s.decode())
                    off += 2 + len(s)
            i += 1
            if ident.startswith("mb/"):
                continue  # MBROLA voices need external databases we do not ship
            out.append(
                EspeakVoice(
                    name=(v.name or b"").decode(), identifier=ident, languages=tuple(langs), gender=v.gender
                )
            )
        return out

    @property
    def voices(self) -> list[EspeakVoice]:
        return list(self._voices)

    def voice(self, short: str) -> EspeakVoice:
        try:
            return self._by_short[short.lower()]
        except KeyError:
            raise UnknownVoice(f"eSpeak has no voice {short!r}") from None

    def _set_voice(self, short: str) -> None:
        v = self.voice(short)
        if self._lib.espeak_SetVoiceByName(v.short.encode()) != 0:
            raise UnknownVoice(f"eSpeak could not select voice {short!r}")

    def _reset(self, voice: str, rate: int, pitch: int, volume: int, wordgap: int) -> None:
        self._set_voice(voice)
        lib = self._lib
        lib.espeak_SetParameter(PARAM_RATE, rate, 0)
        lib.espeak_SetParameter(PARAM_PITCH, pitch, 0)
        lib.espeak_SetParameter(PARAM_RANGE, DEFAULT_RANGE, 0)
        lib.espeak_SetParameter(PARAM_VOLUME, volume, 0)
        lib.espeak_SetParameter(PARAM_WORDGAP, wordgap, 0)
        lib.espeak_SetParameter(PARAM_PUNCTUATION, 0, 0)
        lib.espeak_SetParameter(PARAM_CAPITALS, 0, 0)

    def synth(
        self,
        text: str,
        voice: str,
        rate: int = DEFAULT_RATE,
        pitch: int = DEFAULT_PITCH,
        volume: int = DEFAULT_VOLUME,
        wordgap: int = 0,
        phonemes: bool = False,
        words: list[tuple[int, int, int]] | None = None,
    ) -> bytes:
        """Synthesise ``text``; returns s16le mono PCM at :attr:`sample_rate`.

        ``words`` gets eSpeak's word events: (character position from 1, length, milliseconds).
        """
        data = text.encode("utf-8") + b"\0"
        buf = ctypes.create_string_buffer(data, len(data))
        flags = CHARS_UTF8 | (PHONEMES_INPUT if phonemes else 0)
        with LOCK:
            self._chunks = []
            self._words = words
            try:
                self._reset(voice, rate, pitch, volume, wordgap)
                err = self._lib.espeak_Synth(buf, len(data), 0, POS_CHARACTER, 0, flags, None, None)
                if err != 0:
                    raise EngineUnavailable(f"eSpeak synthesis failed (error {err})")
                self._lib.espeak_Synchronize()
                return b"".join(self._chunks)
            finally:
                self._chunks = []
                self._words = None
                self._reset(voice, DEFAULT_RATE, DEFAULT_PITCH, DEFAULT_VOLUME, 0)

    def text_to_phonemes(self, text: str, voice: str, ipa: bool = False) -> str:
        """The phonemes eSpeak would speak for ``text`` (its own mnemonics, or IPA)."""
        data = text.encode("utf-8") + b"\0"
        buf = ctypes.create_string_buffer(data, len(data))
        ptr = ctypes.c_void_p(ctypes.addressof(buf))
        parts: list[str] = []
        with LOCK:
            self._set_voice(voice)
            while ptr.value:
                res = self._lib.espeak_TextToPhonemes(ctypes.byref(ptr), CHARS_UTF8, 0x02 if ipa else 0)
                if res:
                    parts.append(res.decode("utf-8", "replace"))
        return " ".join(p for p in parts if p)


_INSTANCE: EspeakLib | None = None


def get_lib() -> EspeakLib:
    global _INSTANCE
    with LOCK:
        if _INSTANCE is None:
            _INSTANCE = EspeakLib()
        return _INSTANCE
