"""The consent checks (synth.consent) on real recordings: words check and speaker check.

`python -m tests.bench.bench_consent` (or `python -m tests.bench consent`); about
three minutes on two cores, writes only under var/ (a temporary folder).

Speakers: Debian's flite voices slt, rms, awb and kal16 (kal at 16 kHz: plain
kal is 8 kHz, which the service refuses with ``sample_rate_too_low``), Piper's
en_US-joe-medium and eSpeak NG's en, both through the service's Synthesizer.
Each reads, for two codes:

* (a) the issued phrase with its code;
* (b) the phrase with a wrong code: one digit changed, and every digit changed;

and (c) three other sentences: an unrelated one, the code alone ("My code is
..."), and a consent to another organisation with the right code.

Every recording is checked clean and through a telephone channel: white noise
at 20 dB SNR, down to 8 kHz, mu-law encoded and decoded, back up to 16 kHz (an
8 kHz upload would be refused for its rate; this models a phone recording
uploaded at 16 kHz).

The speaker check embeds a "prompt" of each speaker (another sentence, clean)
and every phrase recording (a and b), and scores same-speaker and
different-speaker pairs against synth.consent.SAME_SPEAKER_THRESHOLD.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from statistics import median

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

from synth import consent

ORGANIZATION = "Acme Corporation"
SPEAKERS = ("flite-slt", "flite-rms", "flite-awb", "flite-kal16", "en_US-joe-medium", "espeak-en")
PROMPT_TEXT = "Please call Stella and ask her to bring these things with her from the store, six spoons of fresh snow peas."
OTHER_TEXTS = (
    ("unrelated", "The birch canoe slid on the smooth planks while the children watched from the shore."),
    ("code only", "My code is {digits}."),
    ("other org", "I agree that Globex Industries may record my voice for training. My code is {digits}."),
)
SNR_DB = 20.0
RATE = 16000


def one_digit_wrong(code: str, rng: random.Random) -> str:
    i = rng.randrange(len(code))
    return code[:i] + rng.choice([d for d in "0123456789" if d != code[i]]) + code[i + 1 :]


def all_digits_wrong(code: str, rng: random.Random) -> str:
    return "".join(rng.choice([d for d in "0123456789" if d != c]) for c in code)


def telephone(audio: np.ndarray, rng: np.random.Generator, snr_db: float = SNR_DB) -> np.ndarray:
    """White noise at ``snr_db``, 8 kHz mu-law (8 bits, mu = 255), back to 16 kHz."""
    signal = audio.astype(np.float64)
    power = float(np.mean(signal**2)) or 1e-12
    noisy = signal + rng.normal(0.0, np.sqrt(power / 10 ** (snr_db / 10)), signal.size)
    narrow = np.clip(resample_poly(noisy, 1, 2), -1.0, 1.0)
    mu = 255.0
    encoded = np.round(np.sign(narrow) * np.log1p(mu * np.abs(narrow)) / np.log1p(mu) * 127.0) / 127.0
    decoded = np.sign(encoded) * np.expm1(np.abs(encoded) * np.log1p(mu)) / mu
    return resample_poly(decoded, 2, 1).astype(np.float32)


class Voices:
    """Speech from the flite voices (CLI) and the service's Synthesizer, as 16 kHz float32."""

    def __init__(self, work: Path) -> None:
        from synth import Synthesizer
        from synth import speaker as sp

        self.work = work
        self.synth = Synthesizer(
            device="cpu", engines=["piper", "espeak"], threads=min(2, os.cpu_count() or 1)
        )
        self.say_service = sp.synthesizer_fn(self.synth, str(work))
        self.n = 0

    def say(self, speaker: str, text: str) -> np.ndarray:
        if speaker.startswith("flite-"):
            self.n += 1
            path = self.work / f"flite-{self.n}.wav"
            subprocess.run(["flite", "-voice", speaker[6:], "-t", text, "-o", str(path)], check=True)
            audio, rate = sf.read(path, dtype="float32")
            path.unlink()
        else:
            audio, rate = self.say_service(speaker, text)
        if audio.ndim == 2:
            audio = audio.mean(axis=1)
        if rate != RATE:
            g = np.gcd(int(rate), RATE)
            audio = resample_poly(audio, RATE // g, int(rate) // g).astype(np.float32)
        return audio


def _spoken(code: str) -> str:
    return " ".join(consent.DIGIT_WORDS[int(d)] for d in code)


def run(quick: bool) -> list[str]:
    if shutil.which("flite") is None:
        return ["consent: skipped (Debian's flite is not installed)"]
    from synth import speaker as sp

    speakers = SPEAKERS[:3] if quick else SPEAKERS
    rng = random.Random(52)
    noise = np.random.default_rng(52)
    var = Path(__file__).resolve().parents[2] / "var"
    var.mkdir(exist_ok=True)
    words_rows: list[str] = []
    # per condition: (kind, accepted?) and the margins of (a) and (c), for the phrase threshold
    totals: dict[str, dict[str, list[int]]] = {}
    margins: dict[str, list[float]] = {"a": [], "c": []}
    prompts: dict[str, list[float]] = {}
    phrase_embeddings: list[tuple[str, str, list[float]]] = []  # (speaker, condition, embedding)
    check_seconds: list[float] = []
    with tempfile.TemporaryDirectory(dir=var, prefix="bench-consent-") as tmp:
        voices = Voices(Path(tmp))
        for speaker in speakers:
            prompts[speaker] = sp.embed(voices.say(speaker, PROMPT_TEXT), RATE)
            recordings: list[tuple[str, str, str, np.ndarray]] = []  # (kind, phrase, code, audio)
            for _ in range(2):
                code = consent.new_code()
                phrase = consent.consent_phrase("en", ORGANIZATION, code)
                for kind, read in (
                    ("a", code),
                    ("b1", one_digit_wrong(code, rng)),
                    ("b6", all_digits_wrong(code, rng)),
                ):
                    spoken = consent.consent_phrase("en", ORGANIZATION, read).replace(
                        " ".join(read), _spoken(read)
                    )
                    recordings.append((kind, phrase, code, voices.say(speaker, spoken)))
            for name, text in OTHER_TEXTS:
                code = consent.new_code()
                phrase = consent.consent_phrase("en", ORGANIZATION, code)
                audio = voices.say(speaker, text.format(digits=_spoken(code)))
                recordings.append((f"c:{name}", phrase, code, audio))
            for condition in ("clean", "mu-law+noise"):
                counts = totals.setdefault(condition, {})
                row: dict[str, list[int]] = {}
                for kind, phrase, code, audio in recordings:
                    heard = audio if condition == "clean" else telephone(audio, noise)
                    started = time.monotonic()
                    verdict = consent.check_words(heard, RATE, phrase, code)
                    check_seconds.append(time.monotonic() - started)
                    group = kind[0] if kind.startswith("c") else kind
                    for tally in (row, counts):
                        tally.setdefault(group, [0, 0])
                        tally[group][0] += verdict.passed
                        tally[group][1] += 1
                    if kind == "a" and not verdict.passed:
                        print(f"  false reject {speaker} {condition}: {verdict}", flush=True)
                    if kind != "a" and verdict.passed:
                        print(f"  false accept {speaker} {condition} {kind}: {verdict}", flush=True)
                    if verdict.margin is not None and kind[0] in margins:
                        margins[kind[0]].append(verdict.margin)
                    if kind in ("a", "b1", "b6"):
                        phrase_embeddings.append((speaker, condition, sp.embed(heard, RATE)))
                line = (
                    f"| {speaker} | {condition} | {_rate(row, 'a', reject=True)} | {_rate(row, 'b1')} "
                    f"| {_rate(row, 'b6')} | {_rate(row, 'c')} |"
                )
                print(line, flush=True)
                words_rows.append(line)
    lines = [
        "Words check (synth.consent.check_words): false rejects of the right code, "
        "false accepts of the rest (count / recordings)",
        "| speaker | condition | right code refused | one digit wrong accepted "
        "| all digits wrong accepted | other sentence accepted |",
        "|---|---|---|---|---|---|",
        *words_rows,
    ]
    for condition, counts in totals.items():
        lines.append(
            f"| all | {condition} | {_rate(counts, 'a', reject=True)} | {_rate(counts, 'b1')} "
            f"| {_rate(counts, 'b6')} | {_rate(counts, 'c')} |"
        )
    lines.append(
        f"phrase margin (MIN_PHRASE_MARGIN {consent.MIN_PHRASE_MARGIN:g}): right phrase "
        f"{_spread(margins['a'])}; other sentences that fitted the grammar {_spread(margins['c'])}"
    )
    lines.append(
        f"one check: median {median(check_seconds):.2f} s, max {max(check_seconds):.2f} s "
        f"({len(check_seconds)} checks)"
    )
    lines.extend(_speaker_table(prompts, phrase_embeddings))
    return [f"consent: {x}" for x in lines]


def _rate(row: dict[str, list[int]], key: str, reject: bool = False) -> str:
    passed, total = row.get(key, [0, 0])
    bad = total - passed if reject else passed
    return f"{bad}/{total}"


def _spread(values: list[float]) -> str:
    if not values:
        return "none"
    return f"min {min(values):.1f}, median {median(values):.1f}, max {max(values):.1f} (n={len(values)})"


def _speaker_table(
    prompts: dict[str, list[float]], recordings: list[tuple[str, str, list[float]]]
) -> list[str]:
    threshold = consent.SAME_SPEAKER_THRESHOLD
    lines = [
        f"Speaker check (synth.consent.speaker_similarity, SAME_SPEAKER_THRESHOLD {threshold:g}): "
        "prompt (clean, another sentence) against each phrase recording",
        "| condition | pairs | n | min | median | max | decided wrongly at the threshold |",
        "|---|---|---|---|---|---|---|",
    ]
    worst: dict[str, float] = {}
    for condition in ("clean", "mu-law+noise"):
        same: list[float] = []
        other: list[float] = []
        for speaker, cond, embedding in recordings:
            if cond != condition:
                continue
            for prompt_speaker, prompt in prompts.items():
                score = consent.speaker_similarity(prompt, embedding)
                if prompt_speaker == speaker:
                    same.append(score)
                else:
                    other.append(score)
                    pair = f"{prompt_speaker} / {speaker} ({condition})"
                    worst[pair] = max(worst.get(pair, -1.0), score)
        for label, scores, wrong in (
            ("same speaker", same, sum(s < threshold for s in same)),
            ("different speakers", other, sum(s >= threshold for s in other)),
        ):
            if scores:
                lines.append(
                    f"| {condition} | {label} | {len(scores)} | {min(scores):.3f} | {median(scores):.3f} "
                    f"| {max(scores):.3f} | {wrong}/{len(scores)} "
                    f"({'false rejects' if label == 'same speaker' else 'false accepts'}) |"
                )
        for candidate in (0.70, 0.75, 0.80, 0.85, 0.90):
            fr = sum(s < candidate for s in same)
            fa = sum(s >= candidate for s in other)
            lines.append(
                f"| {condition} | threshold {candidate:.2f} | | | | | false rejects {fr}/{len(same)}, "
                f"false accepts {fa}/{len(other)} |"
            )
    closest = sorted(worst.items(), key=lambda kv: -kv[1])[:4]
    lines.append(
        "closest different-speaker pairs (prompt / recording): "
        + "; ".join(f"{k} {v:.3f}" for k, v in closest)
    )
    return lines


if __name__ == "__main__":
    started = time.monotonic()
    for line in run(quick=False):
        print(line)
    print(f"({time.monotonic() - started:.0f} s)")
