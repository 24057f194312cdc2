"""The sentence cache through the API and the real worker (issue 33): hits, billing, faults, purges.

Piper on onnxruntime is not seeded, so a sentence rendered twice differs; what a
cached job must be is its stored entries, sample for sample, with the pauses
between them. Jobs here are three short sentences (about a second each on the
shared worker).
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from synth.audio import pcm16_samples
from synth.cache import decode_entry
from synth.normalize import split_sentences
from tests.faults import CACHE_FULL_MARKER
from tests.integration.api.conftest import problem, wait_finished

SENTENCES = ["Your code is four two seven.", "Your table is ready now.", "Thank you for calling."]
TEXT = " ".join(SENTENCES)
GAP = int(round(0.2 * 22050))  # the default pause between sentences, at Joe's native rate


def _run(t: Any, text: str, **fields: Any) -> Any:
    from webapp.speech.models import SynthesisJob

    created = t.client.post("/api/v1/speech", {"text": text, "format": "wav", **fields})
    assert created.status_code == 202, created.content
    body = wait_finished(t.client, created.json()["id"], timeout=90)
    assert body["status"] == "succeeded", body
    job = SynthesisJob.objects.get(id=body["id"])
    assert body["cached_characters"] == job.cached_characters
    return job


def _samples(job: Any) -> np.ndarray:
    from django.conf import settings

    audio, rate = sf.read(str(Path(settings.MEDIA_ROOT) / job.audio_path), dtype="int16")
    assert rate == 22050
    return np.asarray(audio)


def _entries(org: Any) -> dict[Path, Any]:
    from webapp.speech.services import sentence_cache

    folder = sentence_cache.tenant_folder(org.pk)
    return {p: decode_entry(p.read_bytes()) for p in folder.rglob("*.sc")} if folder.is_dir() else {}


def _charged(job: Any) -> int:
    from webapp.speech.models import UsageEvent

    return int(
        UsageEvent.objects.filter(job_key=job.id, kind=UsageEvent.Kind.CHARGE)
        .values_list("characters", flat=True)
        .get()
    )


def _chunk_lengths(text: str) -> list[int]:
    return [len(c) for c in split_sentences(text, "en", 300)]


def _is_stitched(audio: np.ndarray, entries: list[Any]) -> bool:
    """The job is some order of these entries with the pause between each: nothing else, bit for bit."""
    gap = np.zeros(GAP, np.float32)
    for order in itertools.permutations(entries):
        parts: list[np.ndarray] = []
        for i, entry in enumerate(order):
            parts += [gap, entry.audio] if i else [entry.audio]
        if pcm16_samples(np.clip(np.concatenate(parts), -1, 1)).tobytes() == audio.tobytes():
            return True
    return False


def test_it_serves_a_repeated_job_from_the_cache_bit_for_bit_and_bills_the_plan_fraction(
    live_tenant: Any,
) -> None:
    t = live_tenant(cached_character_price=0.5)
    first = _run(t, TEXT)
    assert first.cached_characters == 0 and _charged(first) == first.text_chars
    entries = _entries(t.org)
    assert len(entries) == 3 and all(e is not None for e in entries.values())

    again = _run(t, TEXT)
    assert again.cached_characters == sum(_chunk_lengths(TEXT))
    assert again.duration_seconds == first.duration_seconds
    assert _samples(again).tobytes() == _samples(first).tobytes()
    assert _is_stitched(_samples(again), list(entries.values()))
    cached = min(again.cached_characters, again.text_chars)
    assert _charged(again) == again.text_chars - cached + math.ceil(cached * 0.5)

    # One sentence changed: only it is rendered, the joins are the same pauses, the bill is split.
    changed = f"{SENTENCES[0]} Your table is ready in ten minutes. {SENTENCES[2]}"
    partial = _run(t, changed)
    lengths = _chunk_lengths(changed)
    assert partial.cached_characters == lengths[0] + lengths[2]
    assert _charged(partial) == partial.text_chars - partial.cached_characters + math.ceil(
        partial.cached_characters * 0.5
    )
    after = _entries(t.org)
    assert len(after) == 4
    wanted = [after[p] for p in after if after[p] is not None]
    assert any(_is_stitched(_samples(partial), list(trio)) for trio in itertools.combinations(wanted, 3))

    usage = t.client.get("/api/v1/usage").json()["sentence_cache"]
    assert usage["cached_characters"] == again.cached_characters + partial.cached_characters
    assert (
        usage["fresh_characters"]
        == first.text_chars + again.text_chars + partial.text_chars - usage["cached_characters"]
    )

    # cache: false renders every sentence and keeps nothing new.
    uncached = _run(t, TEXT, cache=False)
    assert uncached.cached_characters == 0 and _charged(uncached) == uncached.text_chars
    assert len(_entries(t.org)) == 4


def test_a_corrupt_entry_is_a_miss_and_a_write_failing_half_way_leaves_no_temp_file(live_tenant: Any) -> None:
    t = live_tenant()
    _run(t, TEXT)
    entries = sorted(_entries(t.org))
    broken = entries[0]
    broken.write_bytes(broken.read_bytes()[:-1000])  # truncated, as by a crash
    entries[1].write_bytes(b"garbage")
    again = _run(t, TEXT)
    assert 0 < again.cached_characters < sum(_chunk_lengths(TEXT))
    assert all(e is not None for e in _entries(t.org).values())  # the broken ones were written anew
    assert len(_entries(t.org)) == 3

    from webapp.speech.services import sentence_cache

    # A write that fails half-way (injected: ENOSPC with the entry's temp file open, as when another
    # writer fills the disk between the free-space check and the write): no entry, no temp file.
    broken_write = live_tenant()
    job = _run(broken_write, f"Marker {CACHE_FULL_MARKER} here. {TEXT}")
    assert job.cached_characters == 0 and job.duration_seconds > 1
    assert _entries(broken_write.org) == {}
    folder = sentence_cache.tenant_folder(broken_write.org.pk)
    assert not [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else True  # no temp left


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small disk (tmpfs) needs root")
def test_a_full_disk_leaves_the_job_uncached_and_writes_nothing(live_tenant: Any) -> None:
    """The tenant's cache folder on a real filesystem of 1 MiB: less free than the cache keeps free
    (TTS_SENTENCE_CACHE_MIN_FREE_BYTES), so the worker writes no entry and the job succeeds."""
    from webapp.speech.services import sentence_cache
    from webapp.tenants.models import Organization

    full = live_tenant()
    folder = sentence_cache.tenant_folder(full.org.pk)
    folder.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], check=True, timeout=30)
    try:
        assert shutil.disk_usage(folder).total <= 1024 * 1024
        job = _run(full, TEXT)
        assert job.status == "succeeded" and job.cached_characters == 0 and job.duration_seconds > 1
        assert [p for p in folder.rglob("*") if p.is_file()] == []  # no entry, no temp file
        assert Organization.objects.get(pk=full.org.pk).sentence_cache_used == 0
    finally:
        subprocess.run(["umount", str(folder)], check=True, timeout=30)
    # The same text on a disk with room: cached.
    _run(full, TEXT)
    assert len(_entries(full.org)) == 3


def test_tenants_never_share_entries_and_delete_cache_empties_a_tenants_own(live_tenant: Any) -> None:
    from webapp.tenants.models import Organization

    one, two = live_tenant(), live_tenant()
    _run(one, TEXT)
    other = _run(two, TEXT)
    assert other.cached_characters == 0  # the same sentences, another tenant: its own render
    assert len(_entries(one.org)) == 3 and len(_entries(two.org)) == 3
    assert Organization.objects.get(pk=one.org.pk).sentence_cache_used > 0

    purged = one.client.delete("/api/v1/cache")
    assert purged.status_code == 200 and purged.json()["bytes_freed"] > 0
    assert _entries(one.org) == {} and len(_entries(two.org)) == 3
    assert Organization.objects.get(pk=one.org.pk).sentence_cache_used == 0
    assert _run(one, TEXT).cached_characters == 0
    assert _run(two, TEXT).cached_characters > 0


def test_cache_must_be_a_boolean_on_both_endpoints(make_tenant: Any) -> None:
    t = make_tenant()
    for value in ("yes", 1, None, "false"):
        response = t.client.post("/api/v1/speech", {"text": "Hello.", "cache": value})
        assert response.status_code == 400 and problem(response)["field"] == "cache", value
        response = t.client.post(
            "/v1/audio/speech", {"model": "tts-1", "input": "Hello.", "voice": "alloy", "cache": value}
        )
        assert response.status_code == 400, value


def test_delete_cache_needs_the_write_scope(make_tenant: Any) -> None:
    t = make_tenant(scopes=["speech:read"])
    assert t.client.delete("/api/v1/cache").status_code == 403


def _fill(org: Any, voice_pk: Any, n: int, size: int = 4000) -> list[Path]:
    """``n`` entries of ``size`` samples in the tenant's folder for a voice, the first the oldest."""
    from synth.cache import SentenceEntry
    from webapp.speech.services import sentence_cache

    store = sentence_cache.DiskStore(sentence_cache.voice_folder(org.pk, voice_pk))
    start = int(time.time()) - 3600
    paths = []
    for i in range(n):
        key = f"{i:02d}" + "ab" * 31
        store.put(key, SentenceEntry(np.full(size, i / 100, np.float32), 22050))
        path = store._path(key)
        # An hour ago and on: older than any bound's tie, younger than any plan's text retention.
        os.utime(path, (start + i, start + i))
        paths.append(path)
    return paths


def test_eviction_keeps_the_tenant_within_its_bound_least_recently_used_first(make_tenant: Any) -> None:
    from webapp.housekeeping.catalog import run_job
    from webapp.speech.services import sentence_cache
    from webapp.speech.services.ledger import storage_used
    from webapp.tenants.models import Organization

    t = make_tenant()
    paths = _fill(t.org, "v1", 6)
    entry = paths[0].stat().st_size  # every entry is as long
    t.org.plan.sentence_cache_bytes = 3 * entry
    t.org.plan.save()
    sentence_cache.DiskStore(paths[0].parent.parent).get(paths[0].stem)  # a hit: the oldest is now the newest
    result = run_job("evict_sentence_cache")
    assert result.counts.get("removed", 0) == 3
    assert [p.exists() for p in paths] == [True, False, False, False, True, True]
    kept = sum(p.stat().st_size for p in paths if p.exists())
    org = Organization.objects.get(pk=t.org.pk)
    assert org.sentence_cache_used == kept <= 3 * entry
    assert storage_used(org) >= kept


def test_deleting_a_voice_or_a_tenant_empties_its_cache(
    make_tenant: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from webapp.speech.models import Voice
    from webapp.speech.operator import delete_tenant
    from webapp.speech.services import sentence_cache
    from webapp.speech.voices import delete_voice

    t = make_tenant()
    voice = Voice.objects.create(
        voice_id=f"cache-test-{t.org.pk}",
        organization=t.org,
        name="v",
        engine="piper",
        language="en_US",
        sample_rate=22050,
    )
    kept = _fill(t.org, "other", 1)
    doomed = _fill(t.org, voice.pk, 2)
    with django_capture_on_commit_callbacks(execute=True):
        delete_voice(t.org, voice)
    assert not any(p.exists() for p in doomed) and kept[0].exists()
    with django_capture_on_commit_callbacks(execute=True):
        delete_tenant(t.org)
    assert not sentence_cache.tenant_folder(t.org.pk).exists()


def test_eviction_takes_tenants_in_turn_when_its_runs_run_out_of_time(make_tenant: Any) -> None:
    """A run whose budget lasts one tenant used to start from the first tenant every time: the
    later tenants were never evicted. Each run now starts where the last one stopped."""
    import datetime as dt

    from webapp.housekeeping.jobs import Context
    from webapp.housekeeping.sentence_cache import evict_sentence_cache
    from webapp.speech.services import sentence_cache

    class OneTenantABudget(Context):
        def out_of_time(self) -> bool:
            self.partial = self.partial or self.counts.get("bytes_kept", -1) >= 0
            return self.partial

    tenants = sorted((make_tenant() for _ in range(3)), key=lambda t: str(t.org.pk))
    for t in tenants:
        paths = _fill(t.org, "v1", 4)
        t.org.plan.sentence_cache_bytes = 2 * paths[0].stat().st_size
        t.org.plan.save()
    over = lambda t: len(_entries(t.org)) > 2  # noqa: E731
    for _ in range(len(sentence_cache.tenants_with_entries())):
        evict_sentence_cache(OneTenantABudget(dt.datetime.now(dt.UTC), 100, float("inf")))
    assert [over(t) for t in tenants] == [False, False, False]


def test_the_whole_cache_stays_under_the_global_cap_oldest_first_over_tenants(
    make_tenant: Any, settings: Any
) -> None:
    from webapp.housekeeping.catalog import run_job
    from webapp.tenants.models import Organization

    first, second = make_tenant(), make_tenant()
    older = _fill(first.org, "v1", 3)  # an hour ago and on
    newer = _fill(second.org, "v1", 3)
    for i, path in enumerate(newer):
        later = time.time() - 60 + i
        os.utime(path, (later, later))
    entry = older[0].stat().st_size
    settings.TTS_SENTENCE_CACHE_MAX_BYTES = 4 * entry  # each tenant within its plan's bound, both over it
    result = run_job("evict_sentence_cache")
    assert result.counts.get("removed_over_cap") == 2
    assert [p.exists() for p in older + newer] == [False, False, True, True, True, True]
    used = Organization.objects.filter(pk__in=[first.org.pk, second.org.pk]).values_list(
        "sentence_cache_used", flat=True
    )
    assert sorted(used) == [entry, 3 * entry]


def test_the_cache_writes_nothing_below_the_free_space_watermark(make_tenant: Any, settings: Any) -> None:
    """What is left of a nearly full disk is the jobs' audio: the cache writes no entry there."""
    import shutil

    from synth.cache import SentenceEntry
    from webapp.speech.services import sentence_cache

    t = make_tenant()
    store = sentence_cache.DiskStore(sentence_cache.voice_folder(t.org.pk, "v1"))
    entry = SentenceEntry(np.zeros(4000, np.float32), 22050)
    store.put("aa" * 20, entry)
    assert store.written > 0 and len(_entries(t.org)) == 1
    free = shutil.disk_usage(sentence_cache.root()).free
    settings.TTS_SENTENCE_CACHE_MIN_FREE_BYTES = free + 1  # as if the disk were that close to full
    store.put("bb" * 20, entry)
    assert len(_entries(t.org)) == 1 and store.get("bb" * 20) is None


def test_no_cached_sentence_outlives_the_plans_text_retention(make_tenant: Any) -> None:
    """A cached sentence is the tenant's text, spoken: it goes when the texts it came from go."""
    from webapp.housekeeping.catalog import run_job
    from webapp.tenants.models import Organization

    t = make_tenant()
    t.org.plan.text_retention_days = 30
    t.org.plan.sentence_cache_bytes = 10**9  # far from the bound: only the age removes
    t.org.plan.save()
    paths = _fill(t.org, "v1", 3)
    day = 86400
    for path, age in zip(paths, (31 * day, 29 * day, 0), strict=True):
        os.utime(path, (time.time() - age, time.time() - age))
    result = run_job("evict_sentence_cache")
    assert result.counts.get("removed", 0) == 1
    assert [p.exists() for p in paths] == [False, True, True]
    assert Organization.objects.get(pk=t.org.pk).sentence_cache_used == sum(
        p.stat().st_size for p in paths[1:]
    )


@pytest.mark.usefixtures("synth_worker", "builtin_voices")
def test_a_count_no_cache_folder_backs_is_reset(make_tenant: Any) -> None:
    """A database restored without its cache (or a folder lost) left the tenant's count standing, and a
    tenant at its storage limit had every submit refused for good: eviction only recounted folders."""
    from webapp.housekeeping.catalog import run_job
    from webapp.speech.services import sentence_cache
    from webapp.tenants.models import Organization

    phantom, real = make_tenant(storage_bytes=10_000), make_tenant()
    paths = _fill(real.org, "v1", 2)
    Organization.objects.filter(pk=phantom.org.pk).update(sentence_cache_used=10_000)
    Organization.objects.filter(pk=real.org.pk).update(sentence_cache_used=1)  # wrong: recounted
    assert not sentence_cache.tenant_folder(phantom.org.pk).exists()
    refused = phantom.client.post("/api/v1/speech", {"text": "Refused by bytes it does not store."})
    assert refused.status_code == 429 and problem(refused)["code"] == "storage_limit"

    result = run_job("evict_sentence_cache")

    assert result.counts.get("phantom_counts_reset") == 1
    assert Organization.objects.get(pk=phantom.org.pk).sentence_cache_used == 0
    assert Organization.objects.get(pk=real.org.pk).sentence_cache_used == sum(
        p.stat().st_size for p in paths
    )
    assert (
        phantom.client.post("/api/v1/speech", {"text": "Stored nothing, refused nothing."}).status_code == 202
    )
