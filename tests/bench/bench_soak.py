"""Soak: short eSpeak jobs through `make run`'s stack while its parts are killed.

Starts ``python -m deploy.stack run`` on its own folder and ports, submits jobs
through Nginx and the API, and meanwhile SIGKILLs a random worker child every
``kill_every`` finished jobs, Redis once (at a third) and PostgreSQL once (at
two thirds); the stack's supervisor brings them back. Meanwhile OpenAI clients
(``/v1/audio/speech``, one per ``LEAVER_EVERY`` jobs, streamed or whole-file)
disconnect at a random moment, each counting the sentences its connection
received. Beside it, two more tenants (tests/bench/soak_tenants.py): one whose webhook
events must arrive on time while the soak tenant's receiver never answers, and
one whose streams fail partway by the CPU limit. Then it checks the books: no job lost, none charged twice, none left
queued or running, every succeeded job's file present with the duration its
row records, no OpenAI job charged more than the sentences its client
received; worker RSS after all jobs against after 100; the longest gap
between two finished jobs.

``make bench`` runs 10,000 jobs (``--quick``: 500); the test suite runs 500
(tests/e2e/test_soak.py).
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import ssl
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
import requests
import soundfile

from tests.bench.soak_tenants import ENV as SIDE_TENANTS_ENV
from tests.bench.soak_tenants import SideResult, SideTenants
from tests.e2e.local_stack import (
    FAST_RECOVERY_ENV,
    StackProcess,
    api_session,
    service_pid,
    submit_until_accepted,
)

ROOT = Path(__file__).resolve().parents[2]
PORTS = {
    "TTS_PG_PORT": "15448",
    "TTS_REDIS_PORT": "16448",
    "TTS_HTTP_PORT": "18448",
    "TTS_HTTPS_PORT": "18449",
}
SOAK_ENV = {
    **FAST_RECOVERY_ENV,
    "TTS_WORKER_CONCURRENCY": "2",
    # Nginx's per-IP flood guard would hold one client to 2 jobs a second.
    "TTS_NGINX_RATE_WRITE": "500r/s",
    "TTS_NGINX_BURST_WRITE": "1000",
    "TTS_NGINX_RATE_GENERAL": "500r/s",
    "TTS_NGINX_BURST_GENERAL": "1000",
    **SIDE_TENANTS_ENV,
}
# A loaded eSpeak child is about 110 MB; one below this is still starting.
SETTLED_CHILD_MB = 50
IN_FLIGHT = 64  # jobs submitted but not finished, at most
TERMINAL = ("succeeded", "failed", "canceled", "expired")


@dataclass
class SoakResult:
    jobs: int
    seconds: float = 0.0
    lost: int = 0
    charged_twice: int = 0
    not_succeeded: dict[str, int] = field(default_factory=dict)
    # "status error_code: error_message" of each job that did not succeed, at most 10.
    failures: list[str] = field(default_factory=list)
    bad_files: list[str] = field(default_factory=list)
    rss_after_100_mb: float = 0.0
    rss_after_all_mb: float = 0.0
    rss_breakdown: list[str] = field(default_factory=list)  # MB per process (parent first), per mark
    longest_gap_s: float = 0.0
    child_kills: int = 0
    refusals: int = 0
    leavers: int = 0  # OpenAI clients that disconnected at a random moment
    leavers_charged_more: list[str] = field(default_factory=list)  # charged past what they received
    # Of those, charged for more than the audio that can be in transit past the web process as a
    # client leaves (IN_TRANSIT_BYTES): what the server cannot know was not received.
    leavers_charged_beyond_transit: list[str] = field(default_factory=list)
    leavers_charged_chars: int = 0
    leavers_received_chars: int = 0
    side: SideResult = field(default_factory=SideResult)  # the tenants beside the soak's (soak_tenants.py)

    def lines(self) -> list[str]:
        growth = (self.rss_after_all_mb / self.rss_after_100_mb - 1) * 100 if self.rss_after_100_mb else 0.0
        return [
            f"soak: {self.jobs} eSpeak jobs in {self.seconds:.0f} s, {self.child_kills} worker children "
            "SIGKILLed, Redis and PostgreSQL SIGKILLed once each",
            f"soak: lost {self.lost}, charged twice {self.charged_twice}, not succeeded {self.not_succeeded}, "
            f"files missing or wrong {len(self.bad_files)}; why: {self.failures}",
            f"soak: worker RSS after 100 jobs {self.rss_after_100_mb:.0f} MB, after {self.jobs} "
            f"{self.rss_after_all_mb:.0f} MB ({growth:+.1f} %); per process: {' / '.join(self.rss_breakdown)}",
            f"soak: longest gap between two finished jobs {self.longest_gap_s:.1f} s; "
            f"submissions refused during outages {self.refusals}",
            f"soak: {self.leavers} OpenAI clients disconnected at random: charged "
            f"{self.leavers_charged_chars} characters for {self.leavers_received_chars} received; "
            f"charged more than received {len(self.leavers_charged_more)} (sentences whose last "
            f"{IN_TRANSIT_BYTES // 1024} KiB or less were still in transit), "
            f"beyond that {len(self.leavers_charged_beyond_transit)}",
            *self.side.lines(),
        ]


class Books:
    """Reads the stack's database directly (the API has no bulk view of every job)."""

    def __init__(self, var: Path) -> None:
        password = (var / "secrets" / "pg_password").read_text().strip()
        self.dsn = f"postgresql://tts:{password}@127.0.0.1:{PORTS['TTS_PG_PORT']}/tts"

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, connect_timeout=3) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def finished(self, ids: list[str]) -> int:
        try:
            rows = self.query(
                "SELECT count(*) FROM speech_synthesisjob WHERE id::text = ANY(%s) AND status = ANY(%s)",
                ids,
                list(TERMINAL),
            )
        except psycopg.Error:
            return -1  # PostgreSQL is being restarted
        return int(rows[0][0])

    def lift_limits(self) -> None:
        """The demo plan's rate, concurrency and storage caps are for people, not for a soak."""
        self.query(
            "UPDATE tenants_plan SET requests_per_minute = 1000000, max_concurrent_jobs = 100000, "
            "monthly_characters = 1000000000000, storage_bytes = 1000000000000"
        )


def _submit(stack: StackProcess, session: requests.Session, n: int, counts: dict[str, int]) -> str:
    job_id, refusals = submit_until_accepted(stack, session, f"Soak job {n} says hello.")
    counts["refusals"] += refusals
    return job_id


def _worker_tree(var: Path) -> psutil.Process:
    return psutil.Process(service_pid(var, "worker"))


def _rss_mb(var: Path, result: SoakResult) -> float | None:
    """Worker parent and children together, or None while a child is being replaced.

    A child just forked (after a kill or a recycle) has not loaded its engine
    yet: counted then, the figure would be one child short and not comparable.
    """
    parent = _worker_tree(var)
    children = parent.children(recursive=True)
    sizes = [p.memory_info().rss / 2**20 for p in [parent, *children]]
    if (
        len(children) != int(SOAK_ENV["TTS_WORKER_CONCURRENCY"])
        or min(sizes[1:], default=0) < SETTLED_CHILD_MB
    ):
        return None
    result.rss_breakdown.append(" + ".join(f"{size:.0f}" for size in sizes))
    return sum(sizes)


def _settled_rss_mb(var: Path, result: SoakResult, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    while (rss := _rss_mb(var, result)) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return rss or 0.0


def _kill_service(var: Path, name: str) -> None:
    os.kill(service_pid(var, name), signal.SIGKILL)


class Chaos:
    """Kills things as jobs finish: a worker child every ``every`` jobs, Redis and PostgreSQL once."""

    def __init__(self, var: Path, jobs: int, every: int) -> None:
        self.var = var
        self.every = every
        self.plan = {jobs // 3: "redis", 2 * jobs // 3: "postgres"}
        self.next_child_kill = every
        self.kills = 0

    def on_progress(self, finished: int) -> None:
        for mark, name in list(self.plan.items()):
            if finished >= mark:
                del self.plan[mark]
                _kill_service(self.var, name)
        if finished >= self.next_child_kill:
            self.next_child_kill += self.every
            children = _worker_tree(self.var).children()
            if children:
                random.choice(children).send_signal(signal.SIGKILL)
                self.kills += 1


# --------------------------------------------------------------------- OpenAI clients that leave

LEAVER_EVERY = 50  # one OpenAI client that disconnects at random per this many soak jobs
LEAVER_SENTENCE = "A soak sentence that the client may not hear."
LEAVER_SENTENCES = 6
LEAVER_TEXT = " ".join([LEAVER_SENTENCE] * LEAVER_SENTENCES)
# What may be past the web process, not yet at the client, as it leaves: the server counts a chunk
# handed once Nginx took it (deploy/asgi_worker.py); Nginx's send buffer to the client (twice
# TTS_NGINX_SNDBUF, 64k: 128 KiB), its own buffer and a TLS record hold the rest (docs/api.md; a
# client that reads slower than the audio comes fills them: tests/integration/api/test_in_transit.py
# measured up to 156 KB).
IN_TRANSIT_BYTES = 192 * 1024
SENTENCE_SLACK = 0.01


@dataclass
class Leaver:
    """One OpenAI request whose client went away: its key (to find its job) and what it received."""

    key: str
    streamed: bool
    received_bytes: int = 0
    whole_file: bool = False  # the whole answer arrived (a file, or a stream to its closing chunk)


def _openai(stack: StackProcess, session: requests.Session, key: str, streamed: bool, **kwargs: Any) -> Any:
    body = {"model": "tts-1", "voice": "espeak-en-us", "input": LEAVER_TEXT}
    body["response_format"] = "pcm" if streamed else "wav"
    headers = {"Idempotency-Key": key}
    if streamed:
        headers["X-Stainless-Raw-Response"] = "stream"  # the official client's streaming
    return session.post(stack.url("/v1/audio/speech"), json=body, headers=headers, stream=streamed, **kwargs)


def _sentence_bytes(stack: StackProcess, session: requests.Session) -> float:
    """PCM bytes of one sentence of LEAVER_TEXT, from one stream read to its end (identical sentences)."""
    for _ in range(30):  # through an outage, if one is under way
        try:
            response = _openai(stack, session, str(uuid.uuid4()), True, timeout=60)
            if response.status_code == 200:
                return len(response.content) / LEAVER_SENTENCES
        except requests.RequestException:
            pass
        time.sleep(2)
    raise RuntimeError("no reference stream of the leavers' text")


def dechunk(body: bytes) -> tuple[int, bool]:
    """Bytes of payload in a chunked body, however much of it arrived (a partial last chunk counts),
    and whether its closing chunk arrived (the whole answer)."""
    payload, at = 0, 0
    while True:
        end = body.find(b"\r\n", at)
        if end < 0:
            return payload, False
        size = int(body[at:end].split(b";")[0] or b"0", 16)
        if size == 0:
            return payload, True
        start = end + 2
        payload += min(size, len(body) - start)
        if len(body) < start + size:
            return payload, False
        at = start + size + 2


def _stream_then_leave(
    stack: StackProcess, api_key: str, idempotency_key: str, patience: float
) -> tuple[int, bool]:
    """A streamed OpenAI request read for ``patience`` seconds after its headers; returns the PCM bytes
    its connection received (what it read, and what had reached its socket when it left: read then,
    without waiting, before the close) and whether that was the whole answer. A plain TLS socket: a
    client library's buffers and chunk sizes would hide how much had arrived."""
    body = json.dumps(
        {"model": "tts-1", "voice": "espeak-en-us", "input": LEAVER_TEXT, "response_format": "pcm"}
    ).encode()
    port = stack.ports["TTS_HTTPS_PORT"]
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {api_key}\r\n"
        f"Idempotency-Key: {idempotency_key}\r\nX-Stainless-Raw-Response: stream\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as conn:
            conn.sendall(head.encode() + body)
            received = bytearray()
            while b"\r\n\r\n" not in received:
                chunk = conn.recv(65536)
                if not chunk:
                    return 0, False
                received += chunk
            status_line, _, rest = bytes(received).partition(b"\r\n\r\n")
            if int(status_line.split()[1]) != 200:
                return 0, False
            answer = bytearray(rest)
            deadline = time.monotonic() + patience
            while (left := deadline - time.monotonic()) > 0:
                conn.settimeout(left)
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    break
                if not chunk:
                    break
                answer += chunk
            conn.setblocking(False)  # leaving: what is here already was received
            while True:
                try:
                    chunk = conn.recv(65536)
                except (ssl.SSLWantReadError, BlockingIOError):
                    break
                if not chunk:
                    break
                answer += chunk
    return dechunk(bytes(answer))


def _leave_at_random(stack: StackProcess, session: requests.Session, api_key: str) -> Leaver:
    """A client that stops at a random moment: a stream read until then, or a whole file not waited for."""
    leaver = Leaver(key=str(uuid.uuid4()), streamed=random.random() < 0.7)
    patience = random.uniform(0.2, 4.0)
    try:
        if leaver.streamed:
            leaver.received_bytes, leaver.whole_file = _stream_then_leave(
                stack, api_key, leaver.key, patience
            )
        else:
            response = _openai(stack, session, leaver.key, False, timeout=(10, patience))
            leaver.whole_file = response.status_code == 200
    except (requests.RequestException, OSError):
        pass  # the read timed out (the client gave up), or an outage: nothing received
    return leaver


class Leavers:
    """Sends a leaving OpenAI client whenever LEAVER_EVERY more soak jobs were submitted."""

    def __init__(self, stack: StackProcess, key: str) -> None:
        self.stack, self.session, self.key = stack, api_session(key), key
        self.sentence_bytes = _sentence_bytes(stack, self.session)
        self.pool = concurrent.futures.ThreadPoolExecutor(2)
        self.sent: list[concurrent.futures.Future[Leaver]] = []

    def on_submitted(self, n: int) -> None:
        if n and n % LEAVER_EVERY == 0:
            self.sent.append(self.pool.submit(_leave_at_random, self.stack, self.session, self.key))

    def finish(self) -> list[Leaver]:
        self.pool.shutdown(wait=True)
        return [f.result() for f in self.sent]

    def sentences_received(self, leaver: Leaver) -> int:
        if leaver.whole_file:
            return LEAVER_SENTENCES
        if not leaver.streamed:
            return 0
        # All sentences are the same: a sentence counts once all of its audio arrived. Renders of
        # the text differ by a few hundred bytes (0.3 % of a sentence) from the reference's.
        near = leaver.received_bytes + SENTENCE_SLACK * self.sentence_bytes
        return min(LEAVER_SENTENCES, math.floor(near / self.sentence_bytes))


def _check_leavers(books: Books, leavers: Leavers, done: list[Leaver], result: SoakResult) -> None:
    """Each leaver's job charged no more than the characters of the sentences its client received."""
    keys = [leaver.key for leaver in done]
    jobs = dict(books.query("SELECT key, job_id::text FROM speech_idempotencykey WHERE key = ANY(%s)", keys))
    job_ids = [j for j in jobs.values() if j]
    deadline = time.monotonic() + 120
    while books.finished(job_ids) < len(job_ids) and time.monotonic() < deadline:
        time.sleep(1)
    rows = books.query(
        "SELECT e.job_key::text, sum(e.characters), max(j.text_chars) FROM speech_usageevent e "
        "JOIN speech_synthesisjob j ON j.id = e.job_key WHERE e.job_key::text = ANY(%s) "
        "AND e.kind = 'charge' GROUP BY e.job_key",
        job_ids,
    )
    charged = {str(r[0]): (int(r[1]), int(r[2])) for r in rows}
    result.leavers = len(done)
    for leaver in done:
        job_id = jobs.get(leaver.key)
        if not job_id or job_id not in charged:
            continue  # no job (refused in an outage), or nothing charged
        chars, text_chars = charged[job_id]
        # What the server charges for k sentences heard of identical ones (lifecycle: ceil).
        allowed = math.ceil(text_chars * leavers.sentences_received(leaver) / LEAVER_SENTENCES)
        result.leavers_charged_chars += chars
        result.leavers_received_chars += allowed
        if chars > allowed:
            how = f"streamed, {leaver.received_bytes} bytes read" if leaver.streamed else "whole file"
            result.leavers_charged_more.append(f"{job_id} ({how}): charged {chars}, received {allowed}")
            # The bytes the charged sentences hold that never arrived (all of them for a whole file).
            sentences = round(chars * LEAVER_SENTENCES / text_chars)
            short = sentences * leavers.sentence_bytes - leaver.received_bytes
            if not leaver.streamed or short > IN_TRANSIT_BYTES + SENTENCE_SLACK * leavers.sentence_bytes:
                result.leavers_charged_beyond_transit.append(f"{job_id} ({how}): {short:.0f} bytes short")


def _drive(
    stack: StackProcess,
    key: str,
    result: SoakResult,
    every: int,
    leavers: Leavers | None = None,
    side: SideTenants | None = None,
) -> list[str]:
    """Submit every job (at most IN_FLIGHT unfinished), killing things on the way; the job ids."""
    books, chaos = Books(stack.var), Chaos(stack.var, result.jobs, every)
    session, counts = api_session(key), {"refusals": 0}
    ids: list[str] = []
    finished = 0
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        pending: set[concurrent.futures.Future[str]] = set()
        for n in range(result.jobs):
            while len(ids) + len(pending) - finished >= IN_FLIGHT:
                finished = max(finished, books.finished(ids))
                if not result.rss_after_100_mb and finished >= 100:
                    # Measured idle, as at the end, and before the kill at 100: a child
                    # forked then has loaded its engine but not yet run jobs.
                    ids.extend(f.result() for f in pending)
                    pending.clear()
                    result.rss_after_100_mb = _idle_rss_mb(stack.var, books, ids, result)
                    finished = books.finished(ids)
                    break  # the kill at 100 waits until the pipeline is full again
                chaos.on_progress(finished)
                time.sleep(0.2)
                done = {f for f in pending if f.done()}
                ids.extend(f.result() for f in done)
                pending -= done
            pending.add(pool.submit(_submit, stack, session, n, counts))
            if leavers is not None:
                leavers.on_submitted(n)
            if side is not None:
                side.on_submitted(n)
        ids.extend(f.result() for f in concurrent.futures.as_completed(pending))
    result.child_kills, result.refusals = chaos.kills, counts["refusals"]
    return ids


def _idle_rss_mb(var: Path, books: Books, ids: list[str], result: SoakResult) -> float:
    """The worker's RSS once every job is done and its children have given back their idle heap."""
    from synth import heap

    _wait_all_finished(books, ids, timeout=120)
    time.sleep(heap.IDLE_TRIM_SECONDS + 1)
    return _settled_rss_mb(var, result)


def _wait_all_finished(books: Books, ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while books.finished(ids) < len(ids) and time.monotonic() < deadline:
        time.sleep(1)


def _check_books(var: Path, books: Books, ids: list[str], result: SoakResult) -> None:
    rows = books.query(
        "SELECT id::text, status, audio_path, duration_seconds, finished_at, error_code, error_message "
        "FROM speech_synthesisjob WHERE id::text = ANY(%s)",
        ids,
    )
    result.lost = len(set(ids)) - len(rows)
    statuses = [r[1] for r in rows]
    result.not_succeeded = {s: statuses.count(s) for s in set(statuses) if s != "succeeded"}
    result.failures = [f"{r[0]} {r[1]} {r[5]}: {r[6]}" for r in rows if r[1] != "succeeded"][:10]
    charges = books.query(
        "SELECT count(*) FROM (SELECT job_key FROM speech_usageevent WHERE job_key::text = ANY(%s) "
        "AND kind = 'charge' GROUP BY job_key HAVING count(*) > 1) AS twice",
        ids,
    )
    result.charged_twice = int(charges[0][0])
    for job_id, status, audio_path, duration, *_ in rows:
        if status != "succeeded":
            continue
        path = var / "media" / audio_path
        if not path.exists() or abs(soundfile.info(str(path)).duration - float(duration or 0)) > 0.05:
            result.bad_files.append(job_id)
    times = sorted(r[4].timestamp() for r in rows if r[4] is not None)
    result.longest_gap_s = max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)


def run_soak(jobs: int, kill_every: int = 200, var: Path | None = None) -> SoakResult:
    var = var or ROOT / "var" / "soak"
    shutil.rmtree(var, ignore_errors=True)
    stack = StackProcess(var, PORTS, **SOAK_ENV)
    result = SoakResult(jobs=jobs)
    try:
        stack.wait_healthy(300)
        found = re.search(r"API key\s+(tts_[A-Za-z0-9]{8}_\S+)", stack.output)
        assert found, stack.output[-2000:]
        books = Books(var)
        side = SideTenants(stack, found.group(1))
        books.lift_limits()  # the side tenants' plans too
        leavers = Leavers(stack, found.group(1))
        started = time.monotonic()
        ids = _drive(stack, found.group(1), result, kill_every, leavers, side)
        left = leavers.finish()
        result.side = side.finish(books)
        _wait_all_finished(books, ids, timeout=120 + jobs * 0.05)
        result.seconds = time.monotonic() - started
        result.rss_after_all_mb = _idle_rss_mb(var, books, ids, result)
        _check_books(var, books, ids, result)
        _check_leavers(books, leavers, left, result)
        assert "giving up" not in stack.output, stack.output[-3000:]
    finally:
        stack.stop_command()
        if stack.proc.poll() is None:
            stack.kill_all()
    return result


def run(quick: bool) -> list[str]:
    result = run_soak(500 if quick else 10_000)
    lines = result.lines()
    if result.rss_after_100_mb:
        lines.append(
            f"soak: RSS grew at most 10 %: {result.rss_after_all_mb / result.rss_after_100_mb - 1 <= 0.10}"
        )
    return lines
