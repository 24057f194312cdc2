"""make backup / make restore: a backup taken while jobs run and temp files come and go, restored
into a fresh var/, holds every job it lists with its audio, and the keys."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import psycopg
import pytest
from django.conf import settings

from deploy import backup
from deploy.provision import StackConfig
from tests.stack import spare_port
from webapp.housekeeping.disk import is_temp_name
from webapp.speech.services import sentence_cache

# A writer's temp files in the jobs' own folder, as the synth library names them
# (`.<job>.<token>.<format>.<hex>.part`), each removed a moment after it was made:
# what a busy node's media folder looks like while tar walks it.
CHURN = r"""
import json, os, random, sys, time, uuid
folder, stop = sys.argv[1], sys.argv[2]
live, made, removed, started = [], 0, 0, time.time()
while not os.path.exists(stop):
    name = os.path.join(folder, f".{uuid.uuid4()}.1.wav.{uuid.uuid4().hex[:8]}.part")
    with open(name, "wb") as f:
        f.write(os.urandom(2048))
    live.append(name)
    made += 1
    if len(live) > 300:
        os.unlink(live.pop(random.randrange(len(live))))
        removed += 1
for name in live:
    os.unlink(name)
print(json.dumps({"made": made, "removed": removed, "started": started, "stopped": time.time()}))
"""

# Rendered uncached (``cache: false``): four jobs of one text would otherwise be one render and three
# cache hits, all done before the backup begins.
TEXT = " ".join(
    f"A backup is taken while this job runs, part {n}. It waits for none of them." for n in range(6)
)

# The restored stack's own app process (webapp.settings on the restored var/: its database, media
# and secrets) answers the tenant's key for each job: its status, and the audio it hands Nginx.
SERVE = """
import json, sys
import django
django.setup()
from django.test import Client
key, ids = sys.argv[1], json.loads(sys.argv[2])
client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
answers = {}
for job_id in ids:
    job = client.get(f"/api/v1/speech/{job_id}", secure=True)
    audio = client.get(f"/api/v1/speech/{job_id}/audio", secure=True)
    answers[job_id] = [job.status_code, job.json().get("status"), audio.status_code, audio.get("X-Accel-Redirect")]
print(json.dumps(answers))
"""


@pytest.fixture
def fresh_cfg(stack: Any) -> StackConfig:
    var_dir = Path(stack.cfg.var_dir, "restored")
    shutil.rmtree(var_dir, ignore_errors=True)
    return StackConfig(
        var_dir=var_dir, pg_port=spare_port(), redis_port=0, http_port=0, https_port=0, name="restore"
    )


def test_a_backup_taken_under_load_restores_every_job_it_lists_with_its_audio(
    live_tenant: Any, stack: Any, fresh_cfg: StackConfig
) -> None:
    from tests.integration.api.conftest import wait_finished
    from webapp.speech.models import SynthesisJob

    tenant = live_tenant()
    first = tenant.client.post("/api/v1/speech", {"text": "Kept in the backup."}).json()["id"]
    assert wait_finished(tenant.client, first)["status"] == "succeeded"
    folder = Path(settings.MEDIA_ROOT, SynthesisJob.objects.get(id=first).audio_path).parent
    stop = Path(stack.cfg.var_dir, "backups", "churn.stop")
    stop.parent.mkdir(parents=True, exist_ok=True)
    stop.unlink(missing_ok=True)
    churn = subprocess.Popen(
        [sys.executable, "-c", CHURN, str(folder), str(stop)], stdout=subprocess.PIPE, text=True
    )
    out = Path(stack.cfg.var_dir, "backups", "test.tar.gz")
    try:
        ids = [
            tenant.client.post("/api/v1/speech", {"text": TEXT, "cache": False}).json()["id"]
            for _ in range(4)
        ]
        time.sleep(0.5)  # the churn under way, the worker on the first jobs
        began = time.time()
        pending = SynthesisJob.objects.filter(id__in=ids).exclude(status="succeeded").count()
        archive = backup.backup(stack.cfg, out, backup.BackupPolicy(allow_clear=True))
        ended = time.time()
    finally:
        stop.touch()
        churned = json.loads(churn.communicate(timeout=30)[0])
    # Under load: jobs still to run as it began, files vanishing all through it.
    assert pending > 0, "every job had finished: the backup did not overlap the work"
    assert churned["started"] < began and churned["stopped"] > ended
    assert churned["removed"] > 1000, churned
    assert archive == out and archive.stat().st_mode & 0o077 == 0, "the archive holds secrets: owner only"
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(".")], "a partial archive is left"

    backup.restore(fresh_cfg, archive)
    with pytest.raises(backup.StackError, match="fresh var/"):
        backup.restore(fresh_cfg, archive)

    restored_media = fresh_cfg.path("media")
    assert not [p for p in restored_media.rglob("*") if is_temp_name(p.name)], "temp files were archived"
    # The sentence cache is rebuilt by use: the tenant's entries were there, none were archived.
    cached = sentence_cache.tenant_folder(tenant.org.pk)
    assert list(cached.rglob("*.sc")), "the tenant's jobs stored no sentence: nothing to leave out"
    restored_cache = Path(restored_media, cached.relative_to(settings.MEDIA_ROOT))
    assert not restored_cache.exists(), "the sentence cache was archived"
    assert (
        fresh_cfg.path("secrets", "api_key_secret").read_text()
        == stack.cfg.path("secrets", "api_key_secret").read_text()
    )
    with backup.postgres_running(fresh_cfg), psycopg.connect(fresh_cfg.database_url) as db:
        listed = db.execute(
            "SELECT id::text, audio_path, audio_bytes, text FROM speech_synthesisjob "
            "WHERE organization_id = %s AND status = 'succeeded'",
            [tenant.org.pk],
        ).fetchall()
        key = db.execute(
            "SELECT secret_hash FROM tenants_apikey WHERE prefix = %s", [tenant.key.prefix]
        ).fetchone()
    assert key == (tenant.key.secret_hash,)
    assert first in {row[0] for row in listed}
    assert ("Kept in the backup.",) in {(row[3],) for row in listed}
    for job_id in ids:  # the load ran to its end meanwhile
        assert wait_finished(tenant.client, job_id)["status"] == "succeeded"
    # Every job the restored database says succeeded is served by the restored stack with the
    # tenant's key (its hash checked with the restored secret), and the file it hands Nginx is
    # the audio, whole, as the original stack served it.
    with backup.postgres_running(fresh_cfg):
        served = subprocess.run(
            [sys.executable, "-c", SERVE, tenant.raw_key, json.dumps([row[0] for row in listed])],
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith(("TTS_", "DJANGO_", "DATABASE_"))},
                **fresh_cfg.django_env(),
                "REDIS_URL": stack.cfg.redis_url,  # Redis holds no backed-up state: the test stack's
                "DJANGO_ALLOWED_HOSTS": "testserver",
                "TTS_LOG_TO_FILE": "0",
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert served.returncode == 0, served.stderr[-3000:]
    answers = json.loads(served.stdout.strip().splitlines()[-1])
    prefix = settings.TTS_ACCEL_REDIRECT_PREFIX
    for job_id, audio_path, audio_bytes, _ in listed:
        status, state, audio_status, accel = answers[job_id]
        assert (status, state, audio_status) == (200, "succeeded", 200), (job_id, answers[job_id])
        assert accel == prefix + quote(audio_path)
        restored = Path(restored_media, unquote(accel.removeprefix(prefix)))
        assert restored.is_file(), f"job {job_id}: {audio_path} missing from the restore"
        assert restored.stat().st_size == audio_bytes
        assert restored.read_bytes() == Path(settings.MEDIA_ROOT, audio_path).read_bytes()
