"""Agent clients, unmodified, against this service: run by the dialect tests with .venv-clients' Python.

    agent_client.py elevenlabs-sdk | pipecat-elevenlabs | pipecat-deepgram  (arguments: --help)

Each speaks ``--text`` whole, then starts ``--long`` and interrupts it once its first audio came,
then speaks ``--after``; it prints one JSON object: the audio each part got (bytes, and what came
after the interruption), the errors the client reported, and its timings. It imports nothing from
this repository: the clients see the service only through their own base URL, over TLS
(SSL_CERT_FILE names the stack's certificate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any


def elevenlabs_sdk(args: argparse.Namespace) -> dict[str, Any]:
    """The official SDK's stream-input client (text_to_speech.convert_realtime)."""
    from elevenlabs.client import ElevenLabs

    client = ElevenLabs(api_key=args.key, base_url=args.base_url)
    out: dict[str, Any] = {"errors": []}

    def words(text: str) -> Any:
        yield from (w + " " for w in text.split())

    started = time.monotonic()
    whole = b"".join(
        client.text_to_speech.convert_realtime(
            voice_id=args.voice, text=words(args.text), output_format="pcm_24000"
        )
    )
    out["whole_bytes"], out["whole_seconds"] = len(whole), time.monotonic() - started
    # Interrupted: the client stops reading after the first audio and leaves (closing the socket).
    stream = client.text_to_speech.convert_realtime(
        voice_id=args.voice, text=words(args.long), output_format="pcm_24000"
    )
    first = next(iter(stream))
    stream.close()
    out["interrupted_bytes"] = len(first)
    after = b"".join(
        client.text_to_speech.convert_realtime(
            voice_id=args.voice, text=words(args.after), output_format="ulaw_8000"
        )
    )
    out["after_bytes"] = len(after)
    return out


async def _pipecat(service: Any, args: argparse.Namespace) -> dict[str, Any]:
    from pipecat.frames.frames import (
        EndFrame,
        ErrorFrame,
        Frame,
        InterruptionFrame,
        TTSAudioRawFrame,
        TTSSpeakFrame,
        TTSStoppedFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineParams, PipelineTask
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

    audio: list[tuple[float, str | None, int]] = []  # (time, context id, bytes)
    stopped: list[tuple[float, str | None]] = []
    errors: list[str] = []
    interrupted: list[float] = []  # when the interruption reached the end of the pipeline

    class Collector(FrameProcessor):
        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            now = time.monotonic()
            if isinstance(frame, TTSAudioRawFrame):
                audio.append((now, frame.context_id, len(frame.audio)))
            elif isinstance(frame, TTSStoppedFrame):
                stopped.append((now, frame.context_id))
            elif isinstance(frame, ErrorFrame):
                errors.append(str(frame.error))
            elif isinstance(frame, InterruptionFrame):
                interrupted.append(now)
            await self.push_frame(frame, direction)

    task = PipelineTask(
        Pipeline([service, Collector()]),
        params=PipelineParams(audio_out_sample_rate=args.rate),
        idle_timeout_secs=None,
    )
    runner = PipelineRunner(handle_sigint=False)
    run = asyncio.create_task(runner.run(task))

    async def until(condition: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline or run.done():
                raise RuntimeError(f"timed out waiting for {what}; errors: {errors}")
            await asyncio.sleep(0.02)

    out: dict[str, Any] = {}
    started = time.monotonic()
    await task.queue_frame(TTSSpeakFrame(args.text))
    await until(lambda: len(stopped) >= 1, 60, "the first text's audio")
    out["whole_bytes"] = sum(n for _, _, n in audio)
    out["whole_seconds"] = stopped[0][0] - started
    before = len(audio)
    await task.queue_frame(TTSSpeakFrame(args.long))
    await until(lambda: len(audio) > before, 60, "the long text's first audio")
    interrupted_context = audio[-1][1]
    await task.queue_frame(InterruptionFrame())
    await until(lambda: bool(interrupted), 10, "the interruption to pass the service")
    cut = interrupted[0]
    await asyncio.sleep(args.settle)
    out["interrupted_bytes"] = sum(n for t, c, n in audio[before:] if c == interrupted_context and t <= cut)
    out["after_interruption_bytes"] = sum(n for t, c, n in audio if c == interrupted_context and t > cut)
    mark = len(audio)
    stops = len(stopped)
    await task.queue_frame(TTSSpeakFrame(args.after))
    await until(lambda: len(stopped) > stops and len(audio) > mark, 60, "the text after the interruption")
    out["after_bytes"] = sum(n for _, c, n in audio[mark:] if c != interrupted_context)
    out["errors"] = errors
    await task.queue_frame(EndFrame())
    await asyncio.wait_for(run, 30)
    return out


def pipecat_elevenlabs(args: argparse.Namespace) -> dict[str, Any]:
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService

    service = ElevenLabsTTSService(
        api_key=args.key,
        url=args.base_url.replace("https://", "wss://"),
        sample_rate=args.rate,
        settings=ElevenLabsTTSService.Settings(voice=args.voice),
    )
    return asyncio.run(_pipecat(service, args))


def pipecat_deepgram(args: argparse.Namespace) -> dict[str, Any]:
    from pipecat.services.deepgram.tts import DeepgramTTSService

    service = DeepgramTTSService(
        api_key=args.key,
        base_url=args.base_url.replace("https://", "wss://"),
        sample_rate=args.rate,
        settings=DeepgramTTSService.Settings(voice=args.voice),
    )
    return asyncio.run(_pipecat(service, args))


CLIENTS = {
    "elevenlabs-sdk": elevenlabs_sdk,
    "pipecat-elevenlabs": pipecat_elevenlabs,
    "pipecat-deepgram": pipecat_deepgram,
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("client", choices=sorted(CLIENTS))
    parser.add_argument("--base-url", required=True, help="https://host:port of the service (Nginx)")
    parser.add_argument("--key", required=True)
    parser.add_argument("--voice", required=True)
    parser.add_argument("--text", required=True)
    parser.add_argument("--long", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--rate", type=int, default=24000)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds watched after the interruption")
    args = parser.parse_args()
    result = CLIENTS[args.client](args)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
