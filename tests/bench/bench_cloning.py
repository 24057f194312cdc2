"""Speaker similarity of ``approximate`` ("closest voice") against the plain default voice.

Prompts come only from speakers that are never candidates: Debian's flite
voices (awb, rms, slt: built from recordings of real speakers) and each eSpeak
NG English voice, held out of the candidates while it is the prompt. Each
prompt goes through the service's own path (synth.prompt's canonical form,
synth.speaker's profile); the outputs speak sentences different from the
prompt's, and the score is the cosine between the prompt's embedding and the
output's. Three outputs per prompt: the default voice, the closest voice
unshifted, and ``approximate`` (the closest voice shifted towards the prompt's
median F0); the unshifted pick shows what the shift itself adds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import soundfile as sf

from synth import DEFAULT_VOICE, Synthesizer
from synth import speaker as sp
from synth.prompt import PromptLimits, prepare_prompt
from synth.registry import list_voices

PROMPT_TEXT = "Please call Stella and ask her to bring these things with her from the store, six spoons of fresh snow peas."
SCORED = (
    "The birch canoe slid on the smooth planks while the children watched from the shore.",
    "A large size in stockings is hard to sell, but the shop kept trying all winter.",
)


def _prompt_audio(source: str, work: Path, synth: Synthesizer) -> Path:
    raw = work / f"{source}.wav"
    if source.startswith("flite-"):
        subprocess.run(["flite", "-voice", source[6:], "-t", PROMPT_TEXT, "-o", str(raw)], check=True)
    else:
        audio, rate = sp.synthesizer_fn(synth, str(work))(source, PROMPT_TEXT)
        sf.write(raw, audio, rate)
    canonical = work / f"{source}.canonical.wav"
    prepare_prompt(str(raw), str(canonical), PromptLimits(max_bytes=20_000_000))
    return canonical


def _score(prompt: sp.SpeakerProfile, synth: Synthesizer, work: Path, voice: str, pitch: float) -> float:
    say = sp.synthesizer_fn(synth, str(work), pitch=pitch)
    scores = [sp.similarity(prompt.embedding, sp.embed(*say(voice, text))) for text in SCORED]
    return sum(scores) / len(scores)


def run(quick: bool) -> list[str]:
    if shutil.which("flite") is None:
        return ["cloning: skipped (Debian's flite is not installed)"]
    synth = Synthesizer(device="cpu", threads=min(2, os.cpu_count() or 1))
    builtin = sp.candidate_voice_ids(list_voices())
    espeak = [v for v in builtin if v.startswith("espeak-")]
    sources = ["flite-awb", "flite-rms", "flite-slt", *(espeak[:2] if quick else espeak)]
    lines = [
        "| prompt | closest voice (similarity) | default voice | closest, unshifted "
        "| closest, full F0 shift | approximate (measured shift) |",
        "|---|---|---|---|---|---|",
    ]
    wins = shift_helps = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        profiles = sp.candidate_profiles(builtin, sp.synthesizer_fn(synth, tmp))
        for source in sources:
            audio, rate = sf.read(_prompt_audio(source, work, synth), dtype="float32")
            prompt = sp.profile(audio, rate)
            candidates = {v: p for v, p in profiles.items() if v != source}  # held out
            full = sp.closest_voice(prompt, candidates)
            pick = sp.approximate_voice(prompt, candidates, lambda s: sp.synthesizer_fn(synth, tmp, pitch=s))
            default = _score(prompt, synth, work, DEFAULT_VOICE, 0.0)
            plain = _score(prompt, synth, work, pick.voice_id, 0.0)
            shifted = _score(prompt, synth, work, full.voice_id, full.pitch_shift)
            approx = _score(prompt, synth, work, pick.voice_id, pick.pitch_shift)
            wins += approx > default
            shift_helps += approx > plain
            line = (
                f"| {source} | {pick.voice_id} ({pick.similarity:.2f}) | {default:.3f} | {plain:.3f} "
                f"| {shifted:.3f} ({full.pitch_shift:+.1f} st) | {approx:.3f} ({pick.pitch_shift:+.1f} st) |"
            )
            print(line, flush=True)
            lines.append(line)
    lines.append(
        f"approximate beats the default voice on {wins} of {len(sources)} prompts; "
        f"its shift beats the unshifted pick on {shift_helps} of {len(sources)}"
    )
    return [f"cloning: {x}" for x in lines]
