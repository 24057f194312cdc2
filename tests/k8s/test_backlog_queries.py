"""The ScaledObjects' backlog queries are the ones the app provides (webapp/speech/services/keda.py),
whose form the partial index speech_job_engine_active_idx serves."""

from __future__ import annotations

from deploy import validate_k8s as validate
from webapp.speech.services import keda

Docs = list[validate.Doc]


def test_each_single_engine_pool_uses_the_apps_query(rendered: dict[str, Docs]) -> None:
    checked = 0
    for docs in rendered.values():
        for so in (d for d in docs if d["kind"] == "ScaledObject"):
            query = so["spec"]["triggers"][0]["metadata"]["query"]
            engines = validate.query_engines(query)
            assert engines, query
            if len(engines) == 1:
                assert query == keda.backlog_query(next(iter(engines)))
                checked += 1
            else:  # a pool of several engines: the same condition on the status, engine IN (...)
                assert keda.ACTIVE_SQL in query and keda.TABLE in query
    assert checked >= 2
