"""Command line: ``python -m synth "Hello there" -o out.wav --voice en_US-joe-medium --format flac``."""

from __future__ import annotations

import argparse
import os
import sys

from synth.errors import SynthError
from synth.registry import DEFAULT_VOICE, FORMATS


def _progress_bar(done: int, total: int) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} sentences")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m synth", description="Text to speech, offline.")
    parser.add_argument("text", nargs="?", help="text to speak ('-' reads standard input)")
    parser.add_argument("-o", "--output", help="output file (default: out.<format>)")
    parser.add_argument("--voice", default=DEFAULT_VOICE)
    parser.add_argument(
        "--format", default=None, choices=FORMATS, help="default: from the output name, else wav"
    )
    parser.add_argument("--rate", type=int, default=None, help="output sample rate in Hz")
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--pitch", type=float, default=0.0, help="semitones")
    parser.add_argument("--volume", type=float, default=0.0, help="dB")
    parser.add_argument("--language", default=None)
    parser.add_argument("--instructions", default=None)
    parser.add_argument("--loudness", type=float, default=None, help="target LUFS")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--voices-dir", default=None, help="folder of extra Piper voices (TTS_VOICES_DIR)")
    parser.add_argument("--list-voices", action="store_true")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    from synth.synthesizer import SynthesisRequest, Synthesizer

    try:
        synth = Synthesizer(device=args.device, voices_dir=args.voices_dir)
        if args.list_voices:
            for v in synth.voices():
                print(f"{v.id}\t{v.language}\t{v.engine}\t{v.sample_rate}\t{v.name}")
            return 0
        text = sys.stdin.read() if args.text == "-" else args.text
        if text is None:
            parser.error("give the text to speak, or --list-voices")
        fmt = args.format
        if fmt is None:
            ext = os.path.splitext(args.output or "")[1].lstrip(".").lower()
            fmt = ext if ext in FORMATS else "wav"
        out = args.output or f"out.{fmt}"
        request = SynthesisRequest(
            text=text,
            voice=args.voice,
            format=fmt,
            sample_rate=args.rate,
            speed=args.speed,
            pitch=args.pitch,
            volume=args.volume,
            language=args.language,
            instructions=args.instructions,
            loudness_lufs=args.loudness,
        )
        result = synth.synthesize(request, out, progress=None if args.quiet else _progress_bar)
    except SynthError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return 2
    print(
        f"{result.path}: {result.duration_seconds:.2f} s {result.format} @ {result.sample_rate} Hz, "
        f"{result.chunks} chunks, RTF {result.rtf:.3f}, peak RSS {result.peak_rss_mb:.0f} MB",
        file=sys.stderr,
    )
    for item in result.applied:
        print(f"applied: {item}", file=sys.stderr)
    for item in result.not_applied:
        print(f"not applied: {item}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
