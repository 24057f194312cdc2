"""The one benchmark harness: `make bench` (or `python -m tests.bench [--quick] [name ...]`).

Each ``tests/bench/bench_<name>.py`` exposes ``run(quick: bool) -> list[str]``
and prints figures measured side by side in one run (ratios, not timed
assertions). The harness runs them in order and repeats every line at the end
so the figures can be pasted into docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
from pathlib import Path


def available() -> list[str]:
    here = Path(__file__).resolve().parent
    return sorted(
        m.name[len("bench_") :] for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench")
    parser.add_argument(
        "names", nargs="*", help=f"benchmarks to run (default: all of {', '.join(available())})"
    )
    parser.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    args = parser.parse_args(argv)
    names = args.names or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    summary: list[str] = []
    for name in names:
        module = importlib.import_module(f"tests.bench.bench_{name}")
        print(f"== {name} ==", flush=True)
        started = time.monotonic()
        lines = module.run(quick=args.quick)
        summary.append(f"== {name} ({time.monotonic() - started:.0f} s) ==")
        summary.extend(lines)
    print("\n".join(["", "Summary", *summary]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
