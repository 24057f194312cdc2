"""synth: the synthesis library the workers run (no Django, usable alone).

``python -m synth "Hello there" -o out.wav``. Importing this package is cheap:
engines (onnxruntime, eSpeak) load only when a Synthesizer needs them.
"""

from synth.errors import (
    AnnotationError,
    AudioRejected,
    Cancelled,
    EngineUnavailable,
    InvalidText,
    SynthError,
    UnknownVoice,
    UnsupportedControl,
    UnsupportedFormat,
    UnsupportedSampleRate,
)
from synth.registry import DEFAULT_VOICE, ENGINES, FORMATS, VoiceInfo, get_voice, list_voices
from synth.synthesizer import SynthesisRequest, SynthesisResult, Synthesizer, synthesize, validate_request

__all__ = [
    "DEFAULT_VOICE",
    "ENGINES",
    "FORMATS",
    "AnnotationError",
    "AudioRejected",
    "Cancelled",
    "EngineUnavailable",
    "InvalidText",
    "SynthError",
    "SynthesisRequest",
    "SynthesisResult",
    "Synthesizer",
    "UnknownVoice",
    "UnsupportedControl",
    "UnsupportedFormat",
    "UnsupportedSampleRate",
    "VoiceInfo",
    "get_voice",
    "list_voices",
    "synthesize",
    "validate_request",
]
