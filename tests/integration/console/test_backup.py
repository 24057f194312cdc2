"""make backup / make restore: an archive of the test stack, restored into a fresh var/, holds its data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from deploy import backup
from deploy.provision import StackConfig
from tests.stack import spare_port


@pytest.fixture
def fresh_cfg(stack: Any) -> StackConfig:
    var_dir = Path(stack.cfg.var_dir, "restored")
    import shutil

    shutil.rmtree(var_dir, ignore_errors=True)
    return StackConfig(
        var_dir=var_dir, pg_port=spare_port(), redis_port=0, http_port=0, https_port=0, name="restore"
    )


def test_a_restored_backup_holds_the_jobs_keys_and_audio(
    live_tenant: Any, stack: Any, fresh_cfg: StackConfig
) -> None:
    from tests.integration.api.conftest import wait_finished
    from webapp.speech.models import SynthesisJob

    tenant = live_tenant()
    job_id = tenant.client.post("/api/v1/speech", {"text": "Kept in the backup."}).json()["id"]
    assert wait_finished(tenant.client, job_id)["status"] == "succeeded"
    job = SynthesisJob.objects.get(id=job_id)
    audio = Path(settings.MEDIA_ROOT, job.audio_path).read_bytes()

    archive = backup.backup(stack.cfg, Path(stack.cfg.var_dir, "backups", "test.tar.gz"))
    assert archive.stat().st_mode & 0o077 == 0, "the archive holds secrets: owner only"
    backup.restore(fresh_cfg, archive)
    with pytest.raises(backup.StackError, match="fresh var/"):
        backup.restore(fresh_cfg, archive)

    assert Path(fresh_cfg.path("media"), job.audio_path).read_bytes() == audio
    assert (
        fresh_cfg.path("secrets", "api_key_secret").read_text()
        == stack.cfg.path("secrets", "api_key_secret").read_text()
    )
    with backup.postgres_running(fresh_cfg), psycopg.connect(fresh_cfg.database_url) as db:
        row = db.execute(
            "SELECT status, audio_path, text FROM speech_synthesisjob WHERE id = %s", [job.pk]
        ).fetchone()
        assert row == ("succeeded", job.audio_path, "Kept in the backup.")
        key = db.execute(
            "SELECT secret_hash FROM tenants_apikey WHERE prefix = %s", [tenant.key.prefix]
        ).fetchone()
        assert key == (tenant.key.secret_hash,)
