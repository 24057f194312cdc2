"""What the sentence cache is worth (issue 33, item 4): `make bench-cache` (``python -m tests.bench cache``).

One run on this machine, voice en_US-joe-medium, the same requests for us and
for Piper's own HTTP server (``python -m piper.http_server``, no cache):

* **Repeated workload**: 200 requests (``--quick``: 40) of one to three
  sentences, each drawn from 40 notification and IVR sentences with
  probability 0.8, else a sentence with a fresh number in it (never seen
  before), so that after a first pass over the 40 about 80 % of sentences are
  hits. ``/v1/audio/speech`` whole WAV through Nginx/TLS, 4 clients. Printed:
  throughput ours/peer (requests and audio seconds per wall second), the hit
  rate seen (characters served from the cache over all characters, read from
  the jobs), CPU seconds per audio second of every process of each system.
* **Fully cached request**: a three-sentence WAV of about 200 characters,
  every sentence cached, one client, FULL_REQUESTS requests: p50 and p95
  (a median of 20 moved by 10 ms between runs; 100 take 5 s).
* **Re-render**: a 30-paragraph document rendered cold, then again after one
  paragraph changed (native submit + ``?wait=`` + download): the time and the
  characters charged of each (plan price for cached characters: 0.25), and the
  peer's time for the same edited document.

Writes its table with the command into docs/performance.md (between the
bench-cache markers).
"""

from __future__ import annotations

import random
import time
from typing import Any

from tests.bench.bench_peer import (
    cpu_seconds,
    native_request,
    openai_request,
    peer_request,
    process_groups,
    run_clients,
    start_ours,
    start_peer,
    wav_seconds,
    write_docs_section,
)
from tests.bench.peer_table import CLIENT, PEER, Result, pct

POOL = [
    "Your package has been shipped.",
    "It will arrive tomorrow before noon.",
    "Your appointment is confirmed.",
    "Please arrive ten minutes early.",
    "Thank you for calling customer service.",
    "All of our agents are busy right now.",
    "Please stay on the line.",
    "Your call is important to us.",
    "Press one for billing.",
    "Press two for technical support.",
    "Press three to speak to an operator.",
    "To hear these options again, press nine.",
    "Your payment was received.",
    "Your balance is now zero.",
    "Your order is ready for pickup.",
    "The store closes at nine tonight.",
    "Your flight is on time.",
    "Boarding begins thirty minutes before departure.",
    "Your table is ready.",
    "Please come to the front desk.",
    "Your password was changed.",
    "If this was not you, contact us at once.",
    "Your subscription renews next week.",
    "You can cancel at any time.",
    "We have received your request.",
    "A member of our team will contact you shortly.",
    "Your verification code expires in ten minutes.",
    "Do not share this code with anyone.",
    "The meeting starts in five minutes.",
    "Please mute your microphone.",
    "Your prescription is ready.",
    "The pharmacy is open until eight.",
    "Your delivery driver is nearby.",
    "Please have your ticket ready.",
    "Your car is ready for collection.",
    "The service took two hours.",
    "Your room has been upgraded.",
    "Checkout is at eleven in the morning.",
    "We are sorry for the inconvenience.",
    "Goodbye, and have a nice day.",
]
FULL_REQUESTS = 100
# Three pool sentences of about 200 characters together: the fully cached request.
FULL = [
    "Thank you for calling the city library, where every branch is open until eight tonight.",
    "To renew the books you have borrowed, press one now.",
    "To reserve a meeting room, press two.",
]
POOL[-3:] = FULL
HIT_SHARE = 0.8
CLIENTS = 4
PRICE = 0.25  # what a cached character costs on the bench's plan
PARAGRAPHS = 30
MARK_START, MARK_END = "<!-- bench-cache:start -->", "<!-- bench-cache:end -->"


# The new sentences are personal notifications, each said once, of about the pool's spoken length
# (1.9 s on average): a hit and a miss then stand for the same work, so the hit rate in characters is
# the hit rate in synthesis, and 80 % hits put the ceiling near 5x (a miss full of spelled-out numbers
# would speak twice as long and lower it; the run prints the ceiling it measured).
FIRST = "Anna Ben Carla David Elena Farid Grace Hugo Iris James Kenji Laura Marco Nina Omar Priya".split()
LAST = (
    "Adams Brooks Chen Diaz Evans Fischer Garcia Hughes Ito Jones Kim Lopez Miller Novak Olsen Patel".split()
)
TEMPLATES = [
    "Welcome back, {first} {last}.",
    "{first}, your order has shipped.",
    "Thank you, {first} {last}.",
    "{first} {last}, your visit is confirmed.",
]


def workload(n: int, seed: int = 33) -> list[str]:
    """``n`` requests of one to three sentences: a pool sentence with probability HIT_SHARE, else a new one."""
    rng = random.Random(seed)
    said: set[str] = set()

    def new_sentence() -> str:
        while True:
            template = rng.choice(TEMPLATES)
            sentence = template.format(first=rng.choice(FIRST), last=rng.choice(LAST))
            if sentence not in said:
                said.add(sentence)
                return sentence

    out = []
    for _ in range(n):
        sentences = [
            rng.choice(POOL) if rng.random() < HIT_SHARE else new_sentence() for _ in range(rng.randint(1, 3))
        ]
        out.append(" ".join(sentences))
    return out


WORDS = "amber birch cedar delta ember fjord grove harbor indigo juniper kestrel lagoon".split()


def document(changed: bool = False) -> str:
    """Thirty paragraphs of two sentences, none of them in the pool or repeated."""
    paragraphs = [
        f"Step {i + 1} of the setup uses the {WORDS[i % 12]} cable and the {WORDS[(i * 5 + 1) % 12]} port. "
        f"Wait until the light marked {WORDS[(i * 7 + 2) % 12]} {i + 1} turns green before you go on."
        for i in range(PARAGRAPHS)
    ]
    if changed:
        paragraphs[PARAGRAPHS // 2] = "Section sixteen was rewritten. It now says something else entirely."
    return "\n\n".join(paragraphs)


def _bench_tenant() -> tuple[Any, str]:
    from webapp.tenants.models import Plan
    from webapp.tenants.services import OPERATOR, create_api_key, create_organization

    limits = {
        "requests_per_minute": 100000,
        "max_concurrent_jobs": 1000,
        "monthly_characters": 10**9,
        "max_characters_per_request": 100_000,
        "cached_character_price": PRICE,
    }
    plan = Plan.objects.create(slug=f"bench-cache-{time.time_ns()}", name="bench cache", **limits)
    org = create_organization(f"bench cache {time.time_ns()}", plan=plan)
    _key, raw = create_api_key(org, "bench", created_by=OPERATOR, scopes=["speech:read", "speech:write"])
    return org, raw


def _jobs_since(org: Any, since: Any) -> tuple[int, int, int]:
    """(characters, cached characters, charged characters) of the tenant's jobs created since ``since``."""
    from django.db.models import Sum

    from webapp.speech.models import SynthesisJob, UsageEvent

    jobs = SynthesisJob.objects.filter(organization=org, created_at__gte=since)
    row = jobs.aggregate(chars=Sum("text_chars"), cached=Sum("cached_characters"))
    charged = UsageEvent.objects.filter(
        job_key__in=list(jobs.values_list("id", flat=True)), kind=UsageEvent.Kind.CHARGE
    ).aggregate(n=Sum("characters"))["n"]
    return int(row["chars"] or 0), int(row["cached"] or 0), int(charged or 0)


def _ceiling(org: Any, since: Any) -> float:
    """What a cache costing nothing would give on this run: all audio over the new sentences' audio.

    From the jobs' sentence timestamps: a pool sentence is a hit after the first pass, any other is new.
    """
    from webapp.speech.models import JobTimestamps

    pool = set(POOL)
    spoken = {True: 0.0, False: 0.0}
    rows = JobTimestamps.objects.filter(job__organization=org, job__created_at__gte=since)
    for sentences in rows.values_list("sentences", flat=True):
        for s in sentences:
            spoken[s["text"].strip() in pool] += float(s["end"]) - float(s["start"])
    return sum(spoken.values()) / spoken[False] if spoken[False] else float("nan")


def _measured(
    name: str, texts: list[str], call: Any, headers: dict[str, str] | None, groups: Any
) -> tuple[Result, float]:
    """A run of ``texts`` over CLIENTS clients, and the CPU seconds every process of the system spent."""
    before = cpu_seconds(groups())
    result = run_clients(name, CLIENTS, len(texts), call, headers, texts_of=texts)
    after = cpu_seconds(groups())
    return result, sum(after[g] - before[g] for g in after if g in before)


def run(quick: bool) -> list[str]:
    from django.utils import timezone

    n = 40 if quick else 200
    texts = workload(n)
    stack, base, _key, _org = start_ours()
    peer = None
    try:
        org, key = _bench_tenant()
        auth = {"Authorization": f"Bearer {key}"}
        peer = start_peer()
        ours_call = lambda s, t: openai_request(s, base, t, stream=False)  # noqa: E731
        # The first pass: every pool sentence once, for both (the peer's is its warm-up).
        run_clients("first pass", CLIENTS, len(POOL), ours_call, auth, texts_of=POOL)
        run_clients(PEER, CLIENTS, len(POOL), peer_request, texts_of=POOL)
        # This process is the client of both: left out of both.
        ours_groups = lambda: {k: v for k, v in process_groups(stack, None).items() if k != CLIENT}  # noqa: E731
        peer_groups = lambda: {"peer": process_groups(stack, peer)["piper.http_server"]}  # noqa: E731
        since = timezone.now()
        peer_run, peer_cpu = _measured(PEER, texts, peer_request, None, peer_groups)
        ours_run, ours_cpu = _measured("ours /v1/audio/speech", texts, ours_call, auth, ours_groups)
        chars, cached, _charged = _jobs_since(org, since)
        ceiling = _ceiling(org, since)

        # A fully cached three-sentence request of about 200 characters, one client.
        full = " ".join(FULL)
        run_clients("fill", 1, 1, ours_call, auth, texts_of=[full])
        cached_run = run_clients("fully cached", 1, FULL_REQUESTS, ours_call, auth, texts_of=[full])

        # The re-render: cold, then one paragraph changed; the peer renders the edited one whole.
        native = lambda s, t: native_request(s, base, t)  # noqa: E731
        marks = []
        for label, text in (("cold", document()), ("one paragraph changed", document(changed=True))):
            mark = timezone.now()
            r = run_clients(label, 1, 1, native, auth, texts_of=[text])
            marks.append((label, r, _jobs_since(org, mark)))
        peer_doc = run_clients(PEER, 1, 1, peer_request, texts_of=[document(changed=True)])
    finally:
        if peer is not None:
            peer.terminate()
        stack.stop_all()

    def per_audio(cpu: float, result: Result) -> float:
        return cpu / result.audio_seconds if result.audio_seconds else float("nan")

    tp_ratio = ours_run.throughput / peer_run.throughput if peer_run.throughput else float("nan")
    table = [
        f"Repeated workload: {n} requests of 1-3 sentences ({HIT_SHARE:.0%} drawn from {len(POOL)} "
        f"notification/IVR sentences, the rest new), {CLIENTS} clients, WAV, after a first pass over the "
        f"{len(POOL)}:",
        "",
        "| system | requests/s | audio-s per wall-s | p50 s | p95 s | CPU-s per audio-s | hit rate |",
        "|---|---|---|---|---|---|---|",
        f"| {PEER} | {n / peer_run.wall:.2f} | {peer_run.throughput:.1f} | {pct(peer_run.latencies, 50):.3f} | "
        f"{pct(peer_run.latencies, 95):.3f} | {per_audio(peer_cpu, peer_run):.3f} | - |",
        f"| ours /v1/audio/speech (Nginx/TLS) | {n / ours_run.wall:.2f} | {ours_run.throughput:.1f} | "
        f"{pct(ours_run.latencies, 50):.3f} | {pct(ours_run.latencies, 95):.3f} | "
        f"{per_audio(ours_cpu, ours_run):.3f} | {cached / chars if chars else 0:.0%} of characters |",
        "",
        f"Throughput ours / peer: {tp_ratio:.2f}x (target >= 2.5x). Ceiling {ceiling:.1f}x: this run's "
        "audio over the audio of its new sentences, what a cache costing nothing would give. "
        "CPU: every process of each system (ours: worker, gunicorn, Nginx, PostgreSQL, Redis; not the "
        "client, this process, which both share).",
        "",
        f"Fully cached 3-sentence WAV request ({len(full)} characters), 1 client, {FULL_REQUESTS} requests: "
        f"p50 {pct(cached_run.latencies, 50) * 1000:.0f} ms, p95 {pct(cached_run.latencies, 95) * 1000:.0f} ms "
        "(target p50 <= 50 ms).",
        "",
        f"Re-render of a {PARAGRAPHS}-paragraph document ({len(document())} characters), submit + ?wait= + "
        f"download, cached characters at {PRICE} of the price:",
        "",
        "| render | seconds | audio s | characters | from the cache | charged |",
        "|---|---|---|---|---|---|",
        *[
            f"| {label} | {r.wall:.2f} | {r.audio_seconds:.1f} | {c[0]} | {c[1]} | {c[2]} |"
            for label, r, c in marks
        ],
        f"| {PEER}, the changed document | {peer_doc.wall:.2f} | {peer_doc.audio_seconds:.1f} | "
        f"{len(document(changed=True))} | - | - |",
    ]
    write_docs(table, quick)
    return table


def write_docs(table: list[str], quick: bool) -> None:
    """Replace the bench-cache section of docs/performance.md (between its markers) with this run."""
    write_docs_section("bench-cache", table, quick, "## The sentence cache (issue 33)", MARK_START, MARK_END)


__all__ = ["run", "wav_seconds", "workload"]
