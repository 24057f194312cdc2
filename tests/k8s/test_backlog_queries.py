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


def test_each_pool_also_scales_on_its_interactive_work_with_the_apps_query(rendered: dict[str, Docs]) -> None:
    pools = 0
    for docs in rendered.values():
        for so in (d for d in docs if d["kind"] == "ScaledObject"):
            triggers = {t["name"]: t for t in so["spec"]["triggers"]}
            backlog, interactive = triggers["backlog"]["metadata"], triggers["interactive"]["metadata"]
            assert interactive["query"] == f"{backlog['query']} AND {keda.INTERACTIVE_SQL}"
            engines = validate.query_engines(backlog["query"]) or set()
            if len(engines) == 1:
                assert interactive["query"] == keda.interactive_query(next(iter(engines)))
            # A smaller target: a client waits on each of these now.
            assert int(interactive["targetQueryValue"]) < int(backlog["targetQueryValue"])
            pools += 1
    assert pools >= 3
