"""Run as the decode child is (``synth.prompt.run_child``): confine itself as the child does,
then report what it can still reach. tests/unit/synth/test_prompt_sandbox.py reads the report.

Arguments: SRC DST LIMITS_JSON SECRET_PATH TCP_PORT.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from synth.prompt import PromptLimits, confine


def main(argv: list[str]) -> int:
    src, dst, raw, secret, port = argv
    applied = confine(src, dst, PromptLimits(**json.loads(raw)))
    report: dict[str, object] = {
        "applied": applied,
        "environ": sorted(os.environ),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "pid": os.getpid(),
        "niceness": os.nice(0),
    }
    try:
        with open(secret) as fh:
            report["secret"] = fh.read()
    except OSError as exc:
        report["secret_error"] = exc.errno
    try:
        with socket.create_connection(("127.0.0.1", int(port)), timeout=2):
            report["connected"] = True
    except OSError as exc:
        report["connect_error"] = exc.errno
    try:
        with open(src, "rb") as fh:
            report["src_bytes"] = len(fh.read())
        with open(dst, "wb") as fh:
            fh.write(b"ok")
        report["wrote_dst"] = True
    except OSError as exc:
        report["io_error"] = str(exc)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
