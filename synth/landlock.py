"""Landlock, the Linux security module any process may use on itself, through its three system calls.

A process hands the kernel the file hierarchies it may still read or write (and, from the
module's ABI 4, that it may neither connect nor bind TCP); from then on it and its children
can reach nothing else, whatever their user may. No privilege, no namespace and no helper
binary is needed, so it works inside containers that refuse user namespaces (their seccomp
profiles allow these calls). The voice-prompt decoder restricts itself this way before it
imports a decoder (synth/prompt.py): the service's secrets and database lie outside what it
keeps.

The constants and layouts are the kernel's uapi (``linux/landlock.h``); no library on PyPI is
past a development release, and ctypes is all three calls need.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from pathlib import Path

_SYS_CREATE_RULESET = 444  # x86-64 and arm64 share these numbers (they came after the unification)
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem rights, by the ABI version that brought them.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
# Rights that make sense on a file (a rule on a file may hold only these).
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
# Network (ABI 4): TCP bind and connect. Scopes (ABI 6): abstract Unix sockets and signals
# to processes outside the domain.
_NET_TCP = (1 << 0) | (1 << 1)
_SCOPES = (1 << 0) | (1 << 1)

READ = READ_FILE | READ_DIR | EXECUTE
WRITE = WRITE_FILE | MAKE_REG | REMOVE_FILE | TRUNCATE


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class LandlockError(OSError):
    pass


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where it has none or leaves it off."""
    try:
        libc = _libc()
        version = int(libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(version, 0)


def _handled_fs(abi: int) -> int:
    return _FS_BY_ABI[max(v for v in _FS_BY_ABI if v <= abi)]


def restrict_self(read: Iterable[Path], write: Iterable[Path]) -> int:
    """From now on this process reaches only ``read`` (read and run) and ``write`` (read, write,
    create and remove files beneath); no TCP from ABI 4. Paths that do not exist are skipped.

    Returns the ABI version enforced; raises :class:`LandlockError` where the kernel has none.
    """
    abi = abi_version()
    if abi < 1:
        raise LandlockError("this kernel does not offer Landlock")
    libc = _libc()
    handled = _handled_fs(abi)
    attr = _RulesetAttr(handled, _NET_TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
    # Older kernels take the struct only as long as they know it.
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = int(libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0))
    if ruleset < 0:
        raise LandlockError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for paths, rights in ((read, READ), (write, READ | WRITE | MAKE_DIR | REMOVE_DIR)):
            for path in paths:
                _add_rule(libc, ruleset, path, rights & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) != 0:
            raise LandlockError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi


def _add_rule(libc: ctypes.CDLL, ruleset: int, path: Path, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS
        rule = _PathBeneathAttr(rights, fd)
        if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise LandlockError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    finally:
        os.close(fd)


__all__ = ["LandlockError", "abi_version", "restrict_self"]
