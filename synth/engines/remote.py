"""Remote engines: models served by upstream servers that speak vLLM-Omni's HTTP surface.

A team that serves CosyVoice3, VoxCPM2 or Qwen3-TTS with a GPU serving engine (vLLM-Omni) puts
it behind this service: each model named in the remote models file (``TTS_REMOTE_MODELS_FILE``,
JSON; docs/engines.md, "Remote engines") is an engine here, with its queue ``synth.<name>``, its
voices and capabilities as declared, and everything else ours (jobs, quotas, the cache, billing).
One plugin serves them all: it reads which model it is from ``EngineOptions.engine``.

Each sentence chunk is one ``POST /v1/audio/speech`` upstream (``response_format: pcm``, streamed),
on the replica of the model with the fewest of this process's requests in flight, below its
``streams_per_upstream``. What comes back is relayed as it comes (the chunk's audio is a
:class:`~synth.engines.base.Pieces`, each streamed block a part), and progress, streaming, time
limits, cancel, the cache and billing stay the service's:

- a cancel closes the upstream request (its connection is shut down) within ``CANCEL_POLL`` s;
- an upstream lost before it sent any audio of the chunk (refused, reset) is marked down for
  ``DOWN_SECONDS`` and the chunk goes to another replica; once audio of the chunk came, the
  chunk fails (never spliced from two replicas);
- a full upstream (429, 503) is waited for, as a queue: the chunk is sent again after a pause,
  until the job's own time limit ends it;
- other answers end the job with a code: ``upstream_failed`` (a 4xx or 5xx, another content type
  than ``audio/pcm``), ``upstream_timeout`` (no byte for ``read_timeout_seconds``).

A cloned voice's prompt is sent with each chunk as ``ref_audio`` (a base64 ``data:`` URL of the
canonical prompt) and ``ref_text``: by default upstreams keep nothing of ours. A model with
``register_voices`` uploads a voice to each replica the first time that replica speaks it
(``POST /v1/audio/voices``, in the background: meanwhile its chunks carry ``ref_audio``) and
then names it; the :class:`VoiceRegistry` the worker gives (its database) records each
registration before the upload starts, so that a deleted voice is deleted on every replica it
may have reached, retried until each confirms (:func:`forget_voice`). A replica that answers a
named voice with 400 or 404 (restarted, it lost it) gets the chunk with ``ref_audio`` again and
the voice anew.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from synth.engines.base import Engine, Pieces, VoiceParams, VoicePrompt, check_cancel
from synth.errors import Cancelled, EngineUnavailable, UnknownVoice, UpstreamFailed, UpstreamTimeout
from synth.registry import (
    FORMATS,
    RATES_BY_FORMAT,
    REMOTE_MODELS_ENV,
    STANDARD_RATES,
    VOLUME_RANGE,
    EngineOptions,
    VoiceInfo,
)

if TYPE_CHECKING:
    import numpy as np
    import requests

    from synth.engines.base import CancelFn, ProgressFn

log = logging.getLogger(__name__)

CANCEL_POLL = 0.2  # seconds between looks at the job's cancel flag while a chunk streams in
DOWN_SECONDS = 10.0  # a replica that refused a connection is skipped this long
BUSY_PAUSE = 0.5  # seconds before a chunk refused by a full upstream is sent again
PCM_TYPES = ("audio/pcm", "audio/l16", "application/octet-stream")


@dataclass(frozen=True)
class RemoteModel:
    """One model of the remote models file."""

    name: str  # the engine's name here: the model a request names, the queue synth.<name>
    upstreams: tuple[str, ...]  # base URLs of its replicas (http(s)://host:port)
    upstream_model: str  # the model id sent upstream (default: ``name``)
    voices: tuple[tuple[str, str, str], ...]  # (upstream voice, language, display name)
    sample_rate: int = 24000  # of the upstream's PCM
    streams_per_upstream: int = 32  # requests in flight at once from one process, per replica
    # Jobs one worker process relays at once, each in a thread of its own: a relay waits on its
    # upstream, so one process holds many (webapp/speech/runtime/batching.py runs them).
    jobs_per_process: int = 64
    cloning: bool = False  # the upstream clones from ref_audio + ref_text
    api_key_env: str = ""  # the environment variable holding the upstreams' key, if any
    register_voices: bool = False  # keep cloned voices on each replica (POST /v1/audio/voices)
    connect_timeout_seconds: float = 5.0
    read_timeout_seconds: float = 30.0
    languages: tuple[str, ...] = field(default=())

    @property
    def api_key(self) -> str:
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""


ALLOW_PRIVATE_ENV = "TTS_REMOTE_ALLOW_PRIVATE"  # addresses or CIDRs an upstream may be at without a warning


def _check_address(name: str, url: str) -> None:
    """Warn of an upstream at an internal address (loopback, private, link-local) not allowed by
    ``TTS_REMOTE_ALLOW_PRIVATE``: the file then sends tenants' text and voices' prompts there. A
    GPU server on the cluster's own network is usual; allowing it silences the warning."""
    host = urlsplit(url).hostname or ""
    try:
        address = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
    except ValueError:
        return  # a host name: where it resolves is the network's business, not the file's
    allowed = [
        ipaddress.ip_network(item.strip(), strict=False)
        for item in os.environ.get(ALLOW_PRIVATE_ENV, "").split(",")
        if item.strip()
    ]
    internal = address.is_private or address.is_loopback or address.is_link_local
    if internal and not any(address in network for network in allowed):
        log.warning(
            "remote model %s: upstream %s is at an internal address (%s); list it in %s if that is meant",
            name,
            url,
            address,
            ALLOW_PRIVATE_ENV,
        )


def _model(name: str, raw: dict[str, Any]) -> RemoteModel:
    upstreams = tuple(str(u).rstrip("/") for u in raw.get("upstreams") or ())
    if not upstreams or not all(u.startswith(("http://", "https://")) for u in upstreams):
        raise ValueError(f"remote model {name}: upstreams must be a list of http(s) URLs")
    for url in upstreams:
        _check_address(name, url)
    voices = tuple(
        (str(v["id"]), str(v.get("language") or "en"), str(v.get("name") or v["id"]))
        for v in raw.get("voices") or ()
    )
    if not voices and not raw.get("cloning"):
        raise ValueError(f"remote model {name}: a model with no preset voices must clone (cloning: true)")
    return RemoteModel(
        name=name,
        upstreams=upstreams,
        upstream_model=str(raw.get("upstream_model") or name),
        voices=voices,
        sample_rate=int(raw.get("sample_rate") or 24000),
        streams_per_upstream=max(1, int(raw.get("streams_per_upstream") or 32)),
        jobs_per_process=max(1, int(raw.get("jobs_per_process") or 64)),
        cloning=bool(raw.get("cloning")),
        api_key_env=str(raw.get("api_key_env") or ""),
        register_voices=bool(raw.get("register_voices")),
        connect_timeout_seconds=float(raw.get("connect_timeout_seconds") or 5.0),
        read_timeout_seconds=float(raw.get("read_timeout_seconds") or 30.0),
        languages=tuple(sorted({lang for _, lang, _ in voices} | set(raw.get("languages") or ()))),
    )


@cache
def _read(path: str) -> dict[str, RemoteModel]:
    data = json.loads(Path(path).read_text())
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise ValueError(f'{path}: expected {{"models": {{name: {{...}}}}}}')
    return {str(name): _model(str(name), raw) for name, raw in models.items()}


def models(path: str | None = None) -> dict[str, RemoteModel]:
    """The remote models of ``path`` (default: ``TTS_REMOTE_MODELS_FILE``); none without a file."""
    path = path if path is not None else os.environ.get(REMOTE_MODELS_ENV, "")
    return _read(path) if path else {}


def model(name: str | None) -> RemoteModel:
    found = models().get(name or "")
    if found is None:
        raise EngineUnavailable(
            f"{name!r} is not a remote model of {os.environ.get(REMOTE_MODELS_ENV) or 'no file'}"
        )
    return found


def _caps(m: RemoteModel) -> dict[str, Any]:
    return {
        "languages": list(m.languages),
        "formats": list(FORMATS),
        "sample_rates": list(STANDARD_RATES),
        "sample_rates_by_format": {k: list(v) for k, v in RATES_BY_FORMAT.items()},
        "controls": ["speed", "volume", "sentence_silence", "loudness"],
        "volume_range": list(VOLUME_RANGE),
        "streaming": True,
        "cloning": m.cloning,
        "instructions": False,
        "timestamps": False,
        "devices": ["cpu"],  # the GPU is the upstream's; this side only relays
        "memory_mb": 0,
        "concurrent_jobs": m.jobs_per_process,
        "seed": False,
        "remote": True,
    }


def _voice_infos(m: RemoteModel) -> list[VoiceInfo]:
    caps = _caps(m)
    return [
        VoiceInfo(vid, name, lang, m.name, m.sample_rate, {**caps, "languages": [lang]})
        for vid, lang, name in m.voices
    ] or [
        # No preset voice: this stands for the uploaded voices the model clones, never speaks alone.
        VoiceInfo(
            "cloned",
            f"{m.name} (uploaded voices clone)",
            "en",
            m.name,
            m.sample_rate,
            {**caps, "prompt_only": True},
        )
    ]


class Replicas:
    """A model's upstream replicas as this process uses them: in flight, capped, and down for a while."""

    def __init__(self, urls: tuple[str, ...], cap: int) -> None:
        self.cap = cap
        self.in_flight = dict.fromkeys(urls, 0)
        self.down_until = dict.fromkeys(urls, 0.0)
        # What the operations page shows per replica (this process's share; the page adds them up).
        self.requests = dict.fromkeys(urls, 0)
        self.failures = dict.fromkeys(urls, 0)
        self.first_audio_ms: dict[str, float | None] = dict.fromkeys(urls, None)  # the latest request's
        self._changed = threading.Condition()

    def take(self, tried: set[str], should_cancel: CancelFn | None) -> str:
        """The least loaded replica not tried yet nor down, once one is below its cap (waits)."""
        with self._changed:
            while True:
                now = time.monotonic()
                usable = [u for u in self.in_flight if u not in tried and self.down_until[u] <= now]
                if not usable:
                    raise UpstreamFailed(f"no replica of {len(self.in_flight)} answered: all refused or down")
                free = [u for u in usable if self.in_flight[u] < self.cap]
                if free:
                    url = min(free, key=lambda u: self.in_flight[u])
                    self.in_flight[url] += 1
                    return url
                check_cancel(should_cancel)
                self._changed.wait(CANCEL_POLL)

    def give_back(self, url: str) -> None:
        with self._changed:
            self.in_flight[url] -= 1
            self._changed.notify()

    def mark_down(self, url: str) -> None:
        with self._changed:
            self.down_until[url] = time.monotonic() + DOWN_SECONDS

    def record(self, url: str, first_audio_ms: float | None = None, failed: bool = False) -> None:
        with self._changed:
            self.requests[url] += 1
            self.failures[url] += int(failed)
            if first_audio_ms is not None:
                self.first_audio_ms[url] = round(first_audio_ms, 3)

    def figures(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self._changed:
            return [
                {
                    "url": url,
                    "in_flight": self.in_flight[url],
                    "down": self.down_until[url] > now,
                    "requests": self.requests[url],
                    "failures": self.failures[url],
                    "first_audio_ms": self.first_audio_ms[url],
                }
                for url in self.in_flight
            ]


_REPLICAS: dict[str, Replicas] = {}
_REPLICAS_LOCK = threading.Lock()


def upstream_figures() -> dict[str, list[dict[str, Any]]]:
    """Per remote model this process used: each replica's figures (a worker's heartbeat carries them)."""
    with _REPLICAS_LOCK:
        models = dict(_REPLICAS)
    return {name: replicas.figures() for name, replicas in sorted(models.items())}


def replicas_of(m: RemoteModel) -> Replicas:
    with _REPLICAS_LOCK:
        found = _REPLICAS.get(m.name)
        if found is None:
            found = _REPLICAS[m.name] = Replicas(m.upstreams, m.streams_per_upstream)
        return found


class VoiceRegistry(Protocol):
    """Where a worker keeps which cloned voices it registered on which replica (its database).

    A registration is recorded by :meth:`begin` before its upload starts, so a voice deleted
    meanwhile is still deleted upstream: the worker retries :func:`forget_voice` on each replica a
    deleted voice's registrations name until each confirms."""

    def registered_name(self, model: str, url: str, key: str) -> str | None:
        """The name voice ``key`` has on replica ``url`` once its upload was confirmed."""

    def begin(self, model: str, url: str, key: str, name: str) -> bool:
        """Record that ``key`` is being registered on ``url`` as ``name``; False: another upload
        of it is in progress (or recently failed), so the caller sends ``ref_audio``."""

    def ended(self, model: str, url: str, key: str, ok: bool) -> None:
        """The upload of ``key`` to ``url`` ended: confirmed (``ok``), or failed (tried again later)."""

    def lost(self, model: str, url: str, key: str) -> None:
        """Replica ``url`` no longer knows ``key``'s voice: register it again before naming it."""

    def in_background(self, work: Callable[[], None]) -> None:
        """Run ``work`` (an upload, then :meth:`ended`) beside the job, as the worker runs threads."""


_registry: VoiceRegistry | None = None


def use_voice_registry(registry: VoiceRegistry | None) -> None:
    """Set by the worker that serves remote models: without one, voices are never registered."""
    global _registry
    _registry = registry


def upstream_voice_name(key: str) -> str:
    """The name a voice is registered under upstream: ours, never the tenant's words."""
    return f"tts-{key}"


def _headers(m: RemoteModel) -> dict[str, str]:
    return {"Authorization": f"Bearer {m.api_key}"} if m.api_key else {}


def register_voice(session: Any, m: RemoteModel, url: str, name: str, prompt: VoicePrompt) -> bool:
    """Upload ``prompt`` to replica ``url`` as ``name`` (vLLM-Omni's multipart upload); True: confirmed."""
    import requests

    form = {"name": name, "consent": prompt.consent or "recorded"}
    if prompt.transcript:
        form["ref_text"] = prompt.transcript
    try:
        with open(prompt.audio_path, "rb") as audio:
            response = session.post(
                f"{url}/v1/audio/voices",
                data=form,
                files={"audio_sample": (f"{name}.wav", audio, "audio/wav")},
                headers=_headers(m),
                timeout=(m.connect_timeout_seconds, m.read_timeout_seconds),
            )
    except (OSError, requests.RequestException) as exc:
        log.warning("remote %s: registering %s on %s failed: %s", m.name, name, url, exc)
        return False
    if not response.ok:
        log.warning("remote %s: %s refused voice %s: %s", m.name, url, name, _message(response))
    return bool(response.ok)


def forget_voice(model: str, url: str, name: str) -> tuple[bool, str]:
    """Delete voice ``name`` on replica ``url`` of remote model ``model``: (confirmed, what was said).

    Confirmed: the replica answered 2xx, or 404 (it does not have it, or no longer: also deleted).
    """
    import requests

    m = models().get(model)
    if m is None:
        return False, f"{model} is not a remote model of this worker's models file"
    try:
        with requests.Session() as session:
            session.trust_env = False  # the machine's proxy variables are not the upstream's route
            response = session.delete(
                f"{url}/v1/audio/voices/{name}", headers=_headers(m), timeout=m.connect_timeout_seconds
            )
    except requests.RequestException as exc:
        return False, f"{type(exc).__name__}: {exc}"[:300]
    if response.ok or response.status_code == 404:
        return True, str(response.status_code)
    return False, f"{response.status_code}: {_message(response)}"


class _Lost(Exception):
    """The replica could not be reached, or dropped the request before any audio came."""


def _samples(blocks: Iterator[bytes], volume_db: float) -> Iterator[np.ndarray]:
    """16-bit PCM blocks as float32 samples, with the request's volume; a sample split between two
    blocks is joined (an HTTP read ends wherever the network put it)."""
    import numpy as np

    from synth.engines.base import apply_gain_db

    carry = b""
    for block in blocks:
        data = carry + block
        whole = len(data) // 2 * 2
        carry = data[whole:]
        if whole:
            audio = np.frombuffer(data[:whole], dtype="<i2").astype(np.float32) / 32768.0
            yield apply_gain_db(audio, volume_db)


class _Refused(Exception):
    """The replica refused the chunk's request (400, 404)."""


def _naming(body: dict[str, Any], name: str | None) -> dict[str, Any]:
    """``body`` naming the voice registered upstream as ``name`` instead of carrying its prompt."""
    if name is None:
        return body
    named = {k: v for k, v in body.items() if k not in ("ref_audio", "ref_text")}
    named["voice"] = name
    return named


class _Busy(Exception):
    """The replica is full (429, 503): the chunk waits and is sent again."""


class RemoteEngine:
    """An :class:`Engine` whose model runs upstream."""

    remote = True  # the worker then watches a job's cancel mid-sentence (its request is closed)

    def __init__(self, m: RemoteModel) -> None:
        self.model = m
        self.name = m.name
        self.device = "cpu"
        self._session: requests.Session | None = None

    def load(self, device: str = "cpu", voice_ids: list[str] | None = None) -> None:
        import requests

        self._session = requests.Session()
        self._session.trust_env = False  # the machine's proxy variables are not the upstream's route
        # A connection kept per stream in flight: urllib3's default keeps 10 per host and opens
        # (then drops, with a warning each) any more that this process's threads need at once.
        adapter = requests.adapters.HTTPAdapter(
            pool_connections=len(self.model.upstreams), pool_maxsize=self.model.streams_per_upstream
        )
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        reachable = [u for u in self.model.upstreams if self._healthy(u)]
        if not reachable:
            raise EngineUnavailable(
                f"no upstream of {self.name} answered /v1/models: {', '.join(self.model.upstreams)}"
            )

    def _healthy(self, url: str) -> bool:
        import requests

        assert self._session is not None
        # /v1/models, not /health: every OpenAI-compatible server has it (this service's health
        # page is /healthz), and it checks the key too.
        headers = {"Authorization": f"Bearer {self.model.api_key}"} if self.model.api_key else {}
        try:
            return self._session.get(
                f"{url}/v1/models", headers=headers, timeout=self.model.connect_timeout_seconds
            ).ok
        except requests.RequestException:
            return False

    def voices(self) -> list[VoiceInfo]:
        return _voice_infos(self.model)

    def capabilities(self) -> dict[str, Any]:
        return _caps(self.model)

    def sample_rate(self, voice: str) -> int:
        return self.model.sample_rate

    def phonemes(self, text: str, params: VoiceParams) -> list[str]:
        return []

    def notes(self, params: VoiceParams) -> list[str]:
        return ["pitch: the upstream model speaks at its own pitch"] if params.pitch else []

    def synthesize(
        self,
        chunks: Iterable[str],
        params: VoiceParams,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        total: int | None = None,
    ) -> Iterator[np.ndarray | Pieces]:
        body = self._body(params)
        done = 0
        for chunk in chunks:
            check_cancel(should_cancel)
            # The chunk's audio as the upstream streams it: the synthesizer writes each part as it
            # comes, and asks for the next chunk once this one's last part came.
            blocks = self._speak({**body, "input": chunk}, should_cancel, params.prompt)
            yield Pieces(_samples(blocks, params.volume))
            done += 1
            if progress is not None:
                progress(done, total if total is not None else done)

    def _body(self, params: VoiceParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model.upstream_model,
            "response_format": "pcm",
            "sample_rate": self.model.sample_rate,
        }
        if params.prompt is not None:
            if not self.model.cloning:
                raise UnknownVoice(f"remote model {self.name} does not clone")
            audio = Path(params.prompt.audio_path).read_bytes()
            body["ref_audio"] = "data:audio/wav;base64," + base64.b64encode(audio).decode("ascii")
            if params.prompt.transcript:
                body["ref_text"] = params.prompt.transcript
            body["task_type"] = "Base"
        else:
            known = {vid for vid, _, _ in self.model.voices}
            local = (
                params.voice.split(":", 1)[1] if params.voice.startswith(self.name + ":") else params.voice
            )
            if local not in known:
                raise UnknownVoice(f"remote model {self.name} has no voice {params.voice!r}")
            body["voice"] = local
        if abs(params.speed - 1.0) > 1e-9:
            body["speed"] = params.speed  # vLLM-Omni refuses speed on a stream: this chunk comes whole
        else:
            body["stream"] = True
            body["stream_format"] = "audio"
        return body

    def _speak(
        self, body: dict[str, Any], should_cancel: CancelFn | None, prompt: VoicePrompt | None
    ) -> Iterator[bytes]:
        """One chunk's PCM as it comes, from the least loaded replica that answers."""
        replicas = replicas_of(self.model)
        tried: set[str] = set()
        names = True  # a registered voice may be named (until a replica refused the name)
        while True:
            url = replicas.take(tried, should_cancel)
            named = self._registered_on(url, prompt) if names else None
            started, first_audio_ms = time.monotonic(), None  # the replica's time to first audio
            try:
                for block in self._request(url, _naming(body, named), should_cancel):
                    if first_audio_ms is None:
                        first_audio_ms = (time.monotonic() - started) * 1000
                    yield block
                replicas.record(url, first_audio_ms)
                return
            except _Refused as exc:
                if named is None or prompt is None or _registry is None:
                    replicas.record(url, failed=True)
                    raise UpstreamFailed(f"remote {self.name}: {url}: {exc}") from None
                # Restarted, the replica lost the voice: this chunk carries ref_audio, and the
                # voice is registered there anew.
                log.warning(
                    "remote %s: %s refused voice %s (%s); sent with ref_audio", self.name, url, named, exc
                )
                _registry.lost(self.name, url, prompt.key)
                names = False
            except _Lost as exc:
                log.warning(
                    "remote %s: replica %s lost the chunk (%s); another takes it", self.name, url, exc
                )
                replicas.record(url, failed=True)
                replicas.mark_down(url)
                tried.add(url)
            except _Busy:
                replicas.record(url)
                check_cancel(should_cancel)
                time.sleep(BUSY_PAUSE)
            except (UpstreamFailed, UpstreamTimeout):
                replicas.record(url, failed=True)
                raise
            finally:
                replicas.give_back(url)

    def _registered_on(self, url: str, prompt: VoicePrompt | None) -> str | None:
        """The name ``prompt``'s voice has on ``url``, or None: send ``ref_audio`` (and, if no upload
        of it to ``url`` is under way, start one for the next chunks)."""
        registry = _registry
        if prompt is None or not prompt.key or not self.model.register_voices or registry is None:
            return None
        name = registry.registered_name(self.name, url, prompt.key)
        if name is None and registry.begin(self.name, url, prompt.key, upstream_voice_name(prompt.key)):

            def upload() -> None:
                ok = register_voice(self._session, self.model, url, upstream_voice_name(prompt.key), prompt)
                registry.ended(self.name, url, prompt.key, ok)

            registry.in_background(upload)
        return name

    def _request(self, url: str, body: dict[str, Any], should_cancel: CancelFn | None) -> Iterator[bytes]:
        """The chunk's PCM from one replica, as it comes. The request runs in a thread of its own so
        that a cancel is seen while the upstream is silent: the connection is then shut down under
        it, as it is when the reader stops reading (a client gone, a limit reached)."""
        received: queue.Queue[tuple[str, Any]] = queue.Queue()
        pump = threading.Thread(target=self._pump, args=(url, body, received), daemon=True)
        pump.start()
        response: Any = None
        got_audio, ended = False, False
        try:
            while True:
                try:
                    kind, value = received.get(timeout=CANCEL_POLL)
                except queue.Empty:
                    if should_cancel is not None and should_cancel():
                        raise Cancelled() from None
                    continue
                if kind == "response":
                    response = value
                elif kind == "audio":
                    got_audio = True
                    yield value
                elif kind == "end":
                    ended = True
                    return
                elif kind == "lost" and not got_audio:
                    raise _Lost(str(value))
                elif kind == "busy":
                    raise _Busy()
                elif kind == "refused":
                    raise _Refused(str(value))
                elif kind == "timeout":
                    raise UpstreamTimeout(
                        f"remote {self.name}: {url} sent nothing for {self.model.read_timeout_seconds:g} s"
                    )
                else:
                    raise UpstreamFailed(f"remote {self.name}: {url}: {value}")
        finally:
            if not ended:
                _shut(response)  # the upstream sees its client go

    def _pump(self, url: str, body: dict[str, Any], out: queue.Queue[tuple[str, Any]]) -> None:
        import requests

        assert self._session is not None
        headers = {"Authorization": f"Bearer {self.model.api_key}"} if self.model.api_key else {}
        timeout = (self.model.connect_timeout_seconds, self.model.read_timeout_seconds)
        try:
            with self._session.post(
                f"{url}/v1/audio/speech", json=body, headers=headers, stream=True, timeout=timeout
            ) as response:
                out.put(("response", response))
                if response.status_code in (429, 503):
                    out.put(("busy", response.status_code))
                    return
                if response.status_code in (400, 404):  # what a voice it does not know gets
                    out.put(("refused", f"answered {response.status_code}: {_message(response)}"))
                    return
                if response.status_code >= 400:
                    out.put(("failed", f"answered {response.status_code}: {_message(response)}"))
                    return
                ctype = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
                if ctype not in PCM_TYPES:
                    out.put(("failed", f"answered {ctype or 'no content type'}, not audio/pcm"))
                    return
                for block in response.iter_content(chunk_size=16384):
                    out.put(("audio", block))
                out.put(("end", None))
        except (requests.ConnectTimeout, requests.ConnectionError) as exc:
            timed_out = isinstance(exc, requests.ConnectionError) and "Read timed out" in str(exc)
            out.put(("timeout", exc) if timed_out else ("lost", exc))
        except requests.Timeout as exc:
            out.put(("timeout", exc))
        except requests.RequestException as exc:
            out.put(("lost", exc))
        except Exception as exc:  # whatever else ends the read, the waiting job must hear of it
            out.put(("failed", f"{type(exc).__name__}: {exc}"))


def _message(response: Any) -> str:
    try:
        error = response.json().get("error")
        return str(error.get("message") if isinstance(error, dict) else error)[:300]
    except ValueError:
        return response.text[:300]


def _shut(response: Any) -> None:
    """End a streaming request under its reader: the upstream sees its client go."""
    if response is None:
        return
    connection = getattr(response.raw, "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    response.close()


class RemotePlugin:
    """The plugin of every remote model; ``options.engine`` names which."""

    def voices(self, options: EngineOptions) -> list[VoiceInfo]:
        return _voice_infos(model(options.engine))

    def capabilities(self, options: EngineOptions) -> dict[str, Any]:
        return _caps(model(options.engine))

    def create(self, options: EngineOptions) -> Engine:
        return RemoteEngine(model(options.engine))


plugin = RemotePlugin()
