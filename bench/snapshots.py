"""A long-lived box's time on gVisor: pause + resume, a checkpoint of 256 MB of live memory, a restore, a fork of 4.

    .venv/bin/python bench/snapshots.py [--rounds 5] [--memory 256] [--copies 4]

One `quinebox.Sandbox` on runsc holding a process with `--memory` MiB of live memory (random bytes, every page
touched; the box's mem grant leaves it room) and a counter it listens with. Then, each `--rounds` times:
`sb.pause(); sb.resume()` (20 of them a round); `sb.checkpoint()` of the whole box; `Sandbox.restore(snapshot)`
of it (the snapshot's files read back and checked first, as for any restore); `sb.fork(--copies)` (a
checkpoint and that many restores). Each copy is checked to answer with its counter before it is closed.
Medians printed, each against its target:

    pause + resume ≤ 50 ms · checkpoint ≤ 2 s · restore ≤ 1 s · fork of 4 ≤ 4 s

Runs in a state dir of its own (a temporary directory, removed at the end), never the user's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

#: Holds `MiB` of live memory and answers its counter on 127.0.0.1:7777.
HOLDER = r"""
import os, socket, sys
memory = bytearray(os.urandom(1 << 20)) * int(sys.argv[1])
for page in range(0, len(memory), 4096):
    memory[page] = page % 251
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 7777))
listener.listen(8)
count = 0
while True:
    conn, _ = listener.accept()
    count += 1
    conn.sendall(f"{count} {len(memory)}\n".encode())
    conn.close()
"""
ASK = ["python3", "-c", "import socket; print(socket.create_connection(('127.0.0.1', 7777), timeout=30).recv(64).decode().strip())"]
TARGETS = {"pause + resume": 0.050, "checkpoint": 2.0, "restore": 1.0, "fork": 4.0}


def answers(sb, memory: int) -> None:
    result = sb.exec(ASK)
    words = result.stdout.split()
    if result.returncode != 0 or len(words) != 2 or int(words[1]) != memory << 20:
        raise SystemExit(f"box {sb.id} did not answer as its holder should: {result.stdout!r} {result.stderr[-300:]!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--memory", type=int, default=256, help="MiB of live memory the box holds")
    parser.add_argument("--copies", type=int, default=4)
    args = parser.parse_args()
    state = tempfile.mkdtemp(prefix="quinebox-bench-state-")
    os.environ["QUINEBOX_STATE_DIR"] = state
    import quinebox
    from quinebox.box.live import snapshots

    times: dict[str, list[float]] = {name: [] for name in TARGETS}
    try:
        with quinebox.Sandbox(backend="oci", runtime="runsc", grants=[f"mem:{args.memory * 2 + 256}m"]) as sb:
            sb.write_file("/world/holder.py", HOLDER)
            sb.exec(["sh", "-c", f"python3 /world/holder.py {args.memory} > /dev/null 2>&1 < /dev/null &"])
            until = time.monotonic() + 120
            while sb.exec(ASK).returncode != 0:
                if time.monotonic() > until:
                    raise SystemExit("the box's holder never listened")
                time.sleep(0.5)
            answers(sb, args.memory)
            for _ in range(args.rounds):
                for _ in range(20):
                    began = time.perf_counter()
                    sb.pause()
                    sb.resume()
                    times["pause + resume"].append(time.perf_counter() - began)
                began = time.perf_counter()
                snapshot = sb.checkpoint()
                times["checkpoint"].append(time.perf_counter() - began)
                began = time.perf_counter()
                copy = quinebox.Sandbox.restore(snapshot.id)
                times["restore"].append(time.perf_counter() - began)
                answers(copy, args.memory)
                copy.close()
                snapshots.remove(snapshot)
                began = time.perf_counter()
                copies = sb.fork(args.copies)
                times["fork"].append(time.perf_counter() - began)
                for each in copies:
                    answers(each, args.memory)
                    each.close()
                answers(sb, args.memory)
            size = snapshot.size
    finally:
        shutil.rmtree(state, ignore_errors=True)
    print(f"one box on gVisor holding {args.memory} MiB of live memory (a snapshot of {size / (1 << 20):.0f} MiB), {args.rounds} rounds:")
    missed = 0
    for name, values in times.items():
        label = f"fork -n {args.copies}" if name == "fork" else name
        median, target = statistics.median(values), TARGETS[name]
        missed += median > target
        print(f"  {label:16} {len(values):4}  median {median * 1000:8.1f} ms  max {max(values) * 1000:8.1f} ms  target ≤ {target * 1000:.0f} ms: {'met' if median <= target else 'MISSED'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
