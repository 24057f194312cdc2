"""Rolling recycle: replace worker children one at a time, so every queue keeps a serving child.

The operator's "Recycle workers" action writes a *plan* to Redis: the worker
children to replace, in order, and how many ready children each node had.
Nothing calls a worker: each child reads the plan in its heartbeat thread and
works out from the heartbeats whose turn it is (:func:`turn`). A child leaves
only when

- every node of the plan is back to its planned number of ready children
  (so the previous child's replacement is ready and nobody else is leaving),
- it is the first child of the plan still ready, and
- every queue it serves has another ready child.

It then leaves through the ordinary recycle path (after its running task, or
at once when idle: ``worker.leave_for_rolling_recycle``); its replacement is
forked by Celery, loads, warms up and reports ready, and the next turn comes.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from celery.signals import task_postrun, task_prerun

from webapp import redis_clients
from webapp.speech import heartbeat
from webapp.speech.runtime import recycling

log = logging.getLogger(__name__)

PLAN_KEY = "tts:rolling-recycle"
# A plan that could not finish (a node that never came back) stops mattering after this.
PLAN_TTL = 6 * 3600
REASON_KIND = "operator"


class Refused(Exception):
    """The request would leave a queue (or a node) without a serving child; the message says why."""


@dataclass(frozen=True)
class Progress:
    total: int
    replaced: int
    current: str | None  # the child whose turn it is, or None
    waiting_for: str  # what the plan waits for, for the page; "" when done
    done: bool


def _ready(beats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in beats if isinstance(b, dict) and b.get("state") == "ready"]


def _engines(beat: dict[str, Any]) -> set[str]:
    engines = beat.get("engines")
    return {str(e) for e in engines} if isinstance(engines, list) else set()


def check_request(beats: list[dict[str, Any]], node: str | None) -> list[dict[str, Any]]:
    """The ready children a request would replace; raises Refused with the reason."""
    ready = _ready(beats)
    targets = [b for b in ready if node is None or b.get("node") == node]
    if not targets:
        raise Refused(f"no ready worker child on node {node}" if node else "no ready worker child")
    if node is not None and len(targets) == 1:
        raise Refused(
            f"node {node} has only one worker child: replacing it leaves the node without a serving "
            "child while the new one loads; add a child (TTS_WORKER_CONCURRENCY) or restart that worker"
        )
    for engine in sorted(set().union(*(_engines(b) for b in targets))):
        serving = [b for b in ready if engine in _engines(b)]
        if len(serving) < 2:
            raise Refused(
                f"queue synth.{engine} has only one ready worker child (pid {serving[0].get('pid')} on "
                f"{serving[0].get('host')}): replacing it would leave the queue without service"
            )
    return targets


def start(node: str | None, requested_by: str, beats: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Write a new plan; raises Refused (also while another plan is still running)."""
    beats = heartbeat.live_workers() if beats is None else beats
    current = read_plan()
    if current is not None and not progress(current, beats).done:
        raise Refused("a rolling recycle is already in progress: wait for it to finish")
    targets = check_request(beats, node)
    ready_per_node = Counter(str(b.get("node")) for b in _ready(beats))
    order = sorted(targets, key=lambda b: (str(b.get("node")), str(b.get("worker_id"))))
    plan = {
        "id": secrets.token_hex(4),
        "requested_by": requested_by,
        "requested_at": time.time(),
        "scope": node or "",
        "order": [str(b.get("worker_id")) for b in order],
        "nodes": {n: ready_per_node[n] for n in sorted({str(b.get("node")) for b in order})},
    }
    redis_clients.heartbeats().set(PLAN_KEY, json.dumps(plan), ex=PLAN_TTL)
    return plan


def read_plan() -> dict[str, Any] | None:
    raw = redis_clients.heartbeats().get(PLAN_KEY)
    if not raw:
        return None
    try:
        plan = json.loads(str(raw))
    except ValueError:
        return None
    return plan if isinstance(plan, dict) and isinstance(plan.get("order"), list) else None


def _short_nodes(plan: dict[str, Any], ready: list[dict[str, Any]]) -> list[str]:
    """Nodes of the plan with fewer ready children than planned: a replacement is still on its way."""
    counts = Counter(str(b.get("node")) for b in ready)
    nodes = plan.get("nodes")
    nodes = nodes if isinstance(nodes, dict) else {}
    return [
        f"{n} ({counts[n]} of {want} ready)" for n, want in sorted(nodes.items()) if counts[n] < int(want)
    ]


def progress(plan: dict[str, Any], beats: list[dict[str, Any]]) -> Progress:
    ready = _ready(beats)
    ready_ids = {str(b.get("worker_id")) for b in ready}
    order = [str(w) for w in plan["order"]]
    remaining = [w for w in order if w in ready_ids]
    short = _short_nodes(plan, ready)
    replaced = len(order) - len(remaining)
    if short:
        return Progress(len(order), replaced, None, "replacement loading on " + ", ".join(short), False)
    if not remaining:
        return Progress(len(order), replaced, None, "", True)
    nxt = next(b for b in ready if str(b.get("worker_id")) == remaining[0])
    others = [b for b in ready if b is not nxt]
    alone = sorted(e for e in _engines(nxt) if not any(e in _engines(o) for o in others))
    if alone:
        return Progress(len(order), replaced, None, "no other ready child serves " + ", ".join(alone), False)
    return Progress(len(order), replaced, remaining[0], f"{remaining[0]} to finish its task", False)


def turn(worker_id: str) -> dict[str, Any] | None:
    """The plan, when it is ``worker_id``'s turn to leave; None otherwise (the usual answer)."""
    plan = read_plan()
    if plan is None or worker_id not in plan["order"]:
        return None
    return plan if progress(plan, heartbeat.live_workers()).current == worker_id else None


def reason(plan: dict[str, Any]) -> str:
    """The recycle reason a child records; its first word is the counter it is filed under."""
    return f"{REASON_KIND} rolling recycle {plan.get('id', '')} by {plan.get('requested_by', '?')}"


# ----------------------------------------------------------------------------- in the worker child


class Child(Protocol):
    """What leaving needs of ``worker.WorkerState``."""

    node: str
    pid: int
    state: str
    tasks_done: int

    def publish(self, ttl: int | None = None) -> None: ...


# Sent to the main thread by the heartbeat thread of the same child, never by another process.
# Not SIGUSR1 (billiard's soft time limit) nor SIGUSR2 (the warm-shutdown hand-back); a real
# SIGWINCH is harmless: the handler acts only once this child decided to leave.
LEAVE_SIGNAL = signal.SIGWINCH
EX_RECYCLE = 0x9B  # billiard.pool.EX_RECYCLE: the parent forks a replacement, no error logged
_in_task = threading.Event()
_leave_if_still_at: list[int] = []


@task_prerun.connect
def _on_task_start(**_: Any) -> None:
    _in_task.set()


@task_postrun.connect
def _on_task_end(**_: Any) -> None:
    _in_task.clear()


def start_recycle(child: Child, why: str) -> bool:
    """Mark ``child`` leaving for ``why``: the exit request, its state and the node's recycle count.

    False when it is leaving already (the first reason stands).
    """
    if recycling.exit_requested():
        return False
    recycling.request_exit(why)
    child.state = "recycling"
    try:
        recycling.record_recycle(redis_clients.heartbeats(), child.node, why, child.pid, child.tasks_done)
    except Exception as exc:
        log.warning("could not record recycle: %s", exc)
    return True


def leave(child: Child, why: str) -> None:
    """Our turn: leave after the running task, or now when idle.

    With a task running, the usual exit hook (``recycling.install_exit_hook``)
    ends the child once the task's result is delivered. Idle, the main thread
    waits for a message in billiard's loop: interrupting it there leaves before
    a message is taken; billiard hands a message it had only started to send
    to another child, and one taken but not yet started is re-queued (acks_late,
    reject on worker lost), so no job is lost either way.
    """
    if not start_recycle(child, why):
        return
    try:
        child.publish()
    except Exception as exc:
        log.warning("heartbeat failed: %s", exc)
    _leave_if_still_at[:] = [child.tasks_done]
    if not _in_task.is_set():
        # A real signal to the main thread: idle, it blocks in a read of billiard's pipe,
        # which only a signal interrupts (the handler runs, and the read is never finished).
        signal.pthread_kill(threading.main_thread().ident or 0, LEAVE_SIGNAL)


def install_leave_handler(current: Callable[[], Child]) -> None:
    def on_leave(signum: int, frame: Any) -> None:
        if _in_task.is_set() or _leave_if_still_at != [current().tasks_done]:
            return  # a task ran or runs: the exit hook ends the child after it
        log.info("worker child %d leaves idle for a rolling recycle", os.getpid())
        # billiard's own sys.exit records the code: the parent sees a recycle.
        sys.exit(EX_RECYCLE)

    signal.signal(LEAVE_SIGNAL, on_leave)
