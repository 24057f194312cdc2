"""A node's children leave for a reason that can wait one at a time (recycling.take_turn)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from webapp.speech.runtime import recycling
from webapp.speech.runtime.recycling import end_turn, take_turn


@pytest.fixture
def node(stack: Any) -> Iterator[str]:
    name = f"host:{uuid.uuid4().hex[:8]}"
    yield name
    stack.redis_client().delete(recycling.TURN_KEY_PREFIX + name)


def beat(node: str, worker_id: str, state: str = "ready") -> dict[str, Any]:
    return {"node": node, "worker_id": worker_id, "state": state}


def test_it_gives_one_of_two_children_ending_tasks_together_the_turn(stack: Any, node: str) -> None:
    r = stack.redis_client()
    beats = [beat(node, "a"), beat(node, "b")]
    assert take_turn(r, node, "a", beats) is True
    assert take_turn(r, node, "b", beats) is False  # both saw the other ready: the key decides
    end_turn(r, node)  # a child of the node reported ready
    assert take_turn(r, node, "b", beats) is True


@pytest.mark.parametrize("state", ["recycling", "starting", "loading", "warming_up"])
def test_it_waits_while_a_sibling_leaves_or_loads(stack: Any, node: str, state: str) -> None:
    r = stack.redis_client()
    assert take_turn(r, node, "a", [beat(node, "a"), beat(node, "b", state)]) is False
    assert not r.exists(recycling.TURN_KEY_PREFIX + node)


@pytest.mark.parametrize("state", ["backoff", "load_failed"])
def test_it_waits_while_a_sibling_cannot_load(stack: Any, node: str, state: str) -> None:
    """The sibling serves nothing: a child leaving now would leave the node empty."""
    r = stack.redis_client()
    beats = [beat(node, "a"), beat(node, "b", state)]
    assert take_turn(r, node, "a", beats) is False
    assert not r.exists(recycling.TURN_KEY_PREFIX + node)
    assert recycling.sibling_cannot_load(node, "a", beats)
    assert not recycling.sibling_cannot_load(node, "b", beats)  # its own state does not count


def test_other_nodes_do_not_count(stack: Any, node: str) -> None:
    r = stack.redis_client()
    other = node + "-other"
    try:
        beats = [beat(node, "a"), beat(other, "x", "loading")]
        assert take_turn(r, node, "a", beats) is True
        assert take_turn(r, other, "y", [beat(other, "y")]) is True  # its own key
    finally:
        r.delete(recycling.TURN_KEY_PREFIX + other)


def test_the_turn_expires_when_no_replacement_reports_ready(stack: Any, node: str) -> None:
    r = stack.redis_client()
    assert take_turn(r, node, "a", [beat(node, "a")]) is True
    assert 0 < r.ttl(recycling.TURN_KEY_PREFIX + node) <= recycling.TURN_TTL


@pytest.fixture
def child(stack: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A worker child's state in this process, at two tasks below its count limit of 3."""
    from webapp.speech.runtime import worker

    state: Any = worker.WorkerState()
    state.health.max_tasks = 3
    state.tasks_done = 1
    turns: list[bool] = [False]
    monkeypatch.setattr(worker, "_my_turn_to_leave", lambda _state: turns[0])
    state.turns = turns
    yield state
    recycling._exit_requested.clear()


def test_a_child_at_its_count_serves_on_until_its_turn(child: Any) -> None:
    from webapp.speech.runtime import worker

    assert worker.after_task(child, None, None, 0) is None  # 2 of 3
    assert worker.after_task(child, None, None, 0) is None  # 3 of 3, not its turn: it serves on
    assert recycling.exit_requested() is None and child.state != "recycling"
    assert child.waiting_since is not None
    child.turns[0] = True
    reason = worker.after_task(child, None, None, 0)
    assert reason == "max_tasks 4 tasks"
    assert recycling.exit_requested() == reason and child.state == "recycling"


def test_a_child_waits_for_its_turn_no_longer_than_the_turn_lasts(child: Any) -> None:
    from webapp.speech.runtime import worker

    child.tasks_done = 2
    assert worker.after_task(child, None, None, 0) is None
    child.waiting_since -= recycling.TURN_TTL + 1
    assert worker.after_task(child, None, None, 0) == "max_tasks 4 tasks"
    assert recycling.exit_requested() == "max_tasks 4 tasks"


def test_a_child_whose_sibling_cannot_load_serves_on_past_the_turn_wait(child: Any) -> None:
    """Its sibling backs off: leaving would empty the node, so the reason keeps waiting."""
    from webapp.speech.runtime import worker

    child.tasks_done = 2
    assert worker.after_task(child, None, None, 0) is None
    child.waiting_since -= recycling.TURN_TTL + 1
    child.sibling_cannot_load = True
    assert worker.after_task(child, None, None, 0) is None
    assert recycling.exit_requested() is None and child.state != "recycling"
    child.sibling_cannot_load = False  # the sibling loaded: the long wait ends the child
    assert worker.after_task(child, None, None, 0) == "max_tasks 5 tasks"


def test_memory_reasons_do_not_wait_for_a_turn(child: Any) -> None:
    from webapp.speech.runtime import worker

    reason = worker.after_task(child, None, None, 0, oom=True)
    assert reason is not None and reason.startswith("oom")
    assert recycling.exit_requested() == reason
