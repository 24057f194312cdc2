"""Issue 12, "Done when": 200 long-polls and 64 waiting /v1/audio/speech requests of one key,
on gunicorn's ASGI workers, while another tenant and /healthz are answered."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.e2e.waiting_load import ROOMY, make_tenant, run_scenario


def test_264_waits_of_one_key_leave_the_other_tenant_and_healthz_answered(
    web: Any, synth_worker: Any, transactional_db: None, builtin_voices: list[str]
) -> None:
    busy, busy_key = make_tenant("busy", **ROOMY)
    _, other_key = make_tenant("other", requests_per_minute=10_000)
    result = run_scenario(web, busy, busy_key, other_key, long_polls=200, openai=64)

    errors = [t.error for t in result.every_answer() if t.error]
    assert errors == []
    assert Counter(t.status for t in result.long_polls) == {200: 200}
    assert Counter(t.status for t in result.openai) == {200: 64}
    assert all(t.answer and t.answer["Content-Type"] == "audio/wav" for t in result.openai)
    # Each long-poll was answered for a change of its job (its claim), not at its 30 s deadline.
    assert all(t.answer and t.answer.json()["status"] != "queued" for t in result.long_polls)
    assert len(result.poll_wake_ms) == 200
    assert result.other_tenant and result.health
    assert all(t.status == 200 for t in [*result.other_tenant, *result.health])
    assert max(t.status for t in result.every_answer()) < 500
    # 200 waiting requests hold no database connection each.
    assert result.db_connections_while_waiting < 60, result.db_connections_while_waiting
    assert result.wall_seconds < 110
