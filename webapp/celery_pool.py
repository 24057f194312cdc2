"""Celery's prefork pool, with every child's exit followed by its replacement at once.

Celery notices that a pool child exited when the child's sentinel pipe becomes
readable, and then joins exited children and forks replacements. The kernel
closes a process's files a moment before the process can be reaped, so the
pool sometimes looks while the child is not yet joinable, finds nothing to
replace, and forks the replacement only at its next periodic check, up to 5 s
later. Measured on one-child workers: 9 of 24 recycles took 2.7-4.7 s to
fork the replacement, the others 0.1 s. A node with one child served nothing
meanwhile. Here the pool looks again shortly after each exit it sees
(docs/decisions.md). And when a lost broker connection makes Celery flush the
pool, it forgets which children are busy although their tasks run on; the next
tasks were then written to busy children and waited behind them while others
idled (a webhook 6.4 s behind an attempt at a receiver that never answers).
The flush here keeps those children marked busy. Selected by ``CELERY_WORKER_POOL``; the commands still say
``--pool prefork``, which Celery resolves to the configured pool.

``_event_process_exit`` is Celery's private method: the pool checks that Celery
still has it as it starts (``webapp/private_apis.py``), and runs Celery's own
pool when it does not. The busy marks are private too (``_busy_workers``, a
job's ``_write_to``): without them the flush is Celery's own.
"""

from __future__ import annotations

from typing import Any

from celery.concurrency import asynpool, prefork

from webapp import private_apis

# Seconds after a child's exit is seen at which the pool is maintained again. Each look
# is a waitpid per child: nothing when every child is in place.
LOOK_AGAIN_AFTER = (0.02, 0.1, 0.5)


class AsynPool(asynpool.AsynPool):  # type: ignore[misc]
    def _event_process_exit(self, hub: Any, proc: Any) -> None:
        super()._event_process_exit(hub, proc)  # type: ignore[misc]
        for delay in LOOK_AGAIN_AFTER:
            hub.call_later(delay, self.maintain_pool)

    def flush(self) -> None:
        running = self._children_running_a_task()
        super().flush()  # type: ignore[misc]
        busy = getattr(self, "_busy_workers", None)
        if busy is not None:
            busy.update(running & set(getattr(self, "_all_inqueues", ())))

    def _children_running_a_task(self) -> set[int]:
        """The input pipes of the children that accepted a task still running (Celery's busy marks)."""
        if not private_apis.POOL_RUNNING_JOB_CHILD.present():
            return set()
        return {
            job._write_to.inqW_fd
            for job in tuple(getattr(self, "_cache", {}).values())
            if job._write_to is not None and job._accepted and not job.ready()
        }


class TaskPool(prefork.TaskPool):  # type: ignore[misc]
    Pool: type[asynpool.AsynPool] = AsynPool

    def on_start(self) -> None:
        # In the worker's parent, before the children fork: a Celery that renamed the method
        # would never call the override (logged once, with Celery's version), so run its own pool.
        if not private_apis.check(private_apis.POOL_EVENT_PROCESS_EXIT):
            self.Pool = asynpool.AsynPool
        super().on_start()
