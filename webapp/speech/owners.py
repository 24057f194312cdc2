"""Who a job's owner is: worker ids, and whether the child behind one is gone.

A running job names its owner (``SynthesisJob.worker``), a worker child's id.
The lifecycle's reaper and the worker runtime's claims both ask whether that
owner is dead; neither runs in the owner's process, so this is read from the
pid (same host and pid namespace) or from the heartbeat census (elsewhere).
"""

from __future__ import annotations

import os
import secrets
import socket

import psutil

from webapp import redis_clients
from webapp.speech import heartbeat


def _pid_namespace() -> str:
    try:
        return format(os.stat("/proc/self/ns/pid").st_ino, "x")
    except OSError:
        return "0"


def _start_stamp(proc: psutil.Process) -> str:
    return format(round(proc.create_time() * 100), "x")


def make_worker_id(pid: int | None = None) -> str:
    """``host:<pid namespace>-<process start>-<random>:pid``: unique per child start.

    Host and pid alone collide between containers that share a host name and
    after pid reuse; the pid stays the last part, as logs and tests read it.
    """
    pid = os.getpid() if pid is None else pid
    nonce = f"{_pid_namespace()}-{_start_stamp(psutil.Process(pid))}-{secrets.token_hex(3)}"
    return f"{socket.gethostname()}:{nonce}:{pid}"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip().replace("-", "")[:8] or "0"
    except OSError:
        return "0"


def make_node_id(parent_pid: int | None = None) -> str:
    """``host:<boot>-<pid namespace>-<parent start>:ppid``: one id per start of a Celery parent.

    Host and parent pid alone collide where the parent is pid 1 (every container)
    and the host names repeat; the kernel's boot id tells hosts apart, the pid
    namespace containers of one host, the parent's start time its restarts. All
    children of one parent derive the same id, with nothing to hand down; the
    parent's pid stays the last part, as the console shows it.
    """
    ppid = os.getppid() if parent_pid is None else parent_pid
    try:
        started = _start_stamp(psutil.Process(ppid))
    except psutil.Error:
        started = "0"
    return f"{socket.gethostname()}:{_boot_id()}-{_pid_namespace()}-{started}:{ppid}"


def owner_is_local(owner: str) -> bool:
    """Whether ``owner`` runs on this host in this pid namespace, where its pid can be checked."""
    host, _, rest = owner.partition(":")
    nonce, _, pid_text = rest.rpartition(":")
    namespace = nonce.split("-", 1)[0]
    return host == socket.gethostname() and pid_text.isdigit() and namespace in ("", _pid_namespace())


def owner_is_dead(owner: str, me: str | None = None) -> bool:
    """Whether the worker child named ``owner`` is gone, or may be (see ``owner_is_local``).

    Same host and pid namespace: the pid tells at once (a zombie, or another
    process that reused the pid since, counts as dead), so a killed child's
    job is picked up within seconds. Elsewhere: its heartbeat key has expired,
    which only makes it a suspect: the claim also needs its lease expired by
    the database clock. When in doubt (Redis unreachable), alive: the lease
    reaper is the backstop.
    """
    if not owner:
        return False
    if me is not None and owner == me:
        return True  # we are running this very message, so that earlier run of "us" is gone
    if owner_is_local(owner):
        nonce, _, pid_text = owner.partition(":")[2].rpartition(":")
        stamp = nonce.split("-")[1] if nonce.count("-") >= 2 else ""
        try:
            proc = psutil.Process(int(pid_text))
            return proc.status() == psutil.STATUS_ZOMBIE or bool(stamp and _start_stamp(proc) != stamp)
        except psutil.NoSuchProcess:
            return True
    try:
        return not bool(redis_clients.heartbeats().exists(heartbeat.KEY_PREFIX + owner))
    except Exception:
        return False
