"""Fuzz the host's boundaries for as long as you let it: what CI runs bounded, here with many more examples.

    .venv/bin/python bench/fuzz.py [--minutes 30] [--rounds 2000]

Alternates the property tests (frames, the broker, --world-tar archives) under
the `long` hypothesis profile with a box that throws hostile frames at its
host's socket (tests/fuzz/box_fuzzer.py), a new seed each time (one pass of the
properties takes some minutes; the deadline is checked between passes). Stops at the
first failure and prints how to run it again; Ctrl-C stops it at any time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROPERTIES = ["tests/unit/guest/test_protocol_properties.py", "tests/unit/agent/test_broker_properties.py", "tests/unit/worlds/test_archive_properties.py"]


def properties() -> bool:
    env = {**os.environ, "QUINEBOX_FUZZ": "long"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PROPERTIES], cwd=ROOT, env=env).returncode == 0


def in_a_box(seed: int, rounds: int) -> bool:
    import quinebox

    crashes: list[BaseException] = []
    threading.excepthook = lambda args: crashes.append(args.exc_value)
    result = quinebox.exec(["python3", "/world/box_fuzzer.py", str(seed), str(rounds)], world_from=[str(ROOT / "tests" / "fuzz" / "box_fuzzer.py")])
    ok = result.returncode == 0 and result.stdout == f"ok {rounds}\n".encode() and not crashes
    print(f"box seed {seed}: {result.stdout.decode().strip() or result.stderr.decode().strip()}" + (f"; host threads crashed: {crashes}" if crashes else ""))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rounds", type=int, default=2000, help="connections per box")
    args = parser.parse_args()
    until, seed = time.monotonic() + args.minutes * 60, 1000
    while time.monotonic() < until:
        if not properties():
            print("a property failed: hypothesis printed the example and a blob to reproduce it", file=sys.stderr)
            return 1
        if not in_a_box(seed, args.rounds):
            print(f"the box fuzzer failed: python tests/fuzz/box_fuzzer.py {seed} {args.rounds} in a box reproduces it", file=sys.stderr)
            return 1
        seed += 1
    print("no failure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
