"""A served `quinebox exec -- true`'s CPU, client to exit, with its parts: CPU time, not wall (load moves it less).

    .venv/bin/python bench/serve_cpu.py [--execs 100] [--batch 10] [--pool 4] [--backend NAME]

`--backend` (QUINEBOX_BACKEND for the server and its clients: bwrap, oci, docker) measures that backend's boxes, whatever
`auto` picks here; `--pool 0` keeps no warm box (each command's box starts cold in its worker: bwrap keeps none).

A state dir of its own, and `quinebox serve --pool N` in the foreground as this process's child, with this process a
child subreaper: every process the server's tree starts and orphans (a box's init, a runtime's helpers) is reaped
here, so its CPU is counted too. `--execs` commands run one after another, in batches of `--batch`; after each batch
the pool is given time to refill (each command is a warm claim, and its refill is counted in its batch). Per exec:

    client        the thin client `quinebox` (its interpreter start, imports, the socket): its own rusage
    server        the server's own CPU (accept, fork the next worker) + the worker's (the command's CLI code, the
                  claim, the report): the worker's getrusage(RUSAGE_SELF), taken in it as it ends
    pool keeper   the keeper's own CPU (its Python: starting the refill, handing a box)
    runtime+box   the rest of the server's tree: `runc` run/init/exec/delete, the warm box's init, `true` itself

Medians over the batches of each batch's CPU per exec (the client's: over single execs); the machine's core count
is printed. `PYTHONDONTWRITEBYTECODE` is dropped: the client runs from cached bytecode, as installed. A figure of CPU,
not a ratio: compare two trees (or two backends) by running this in each, one after the other.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
TICK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36


def hooked_serve(records: str, pool: str) -> None:
    """The server, with each worker writing the CPU of each command it ran (its own, and its reaped children's, since
    the last one it ran or since its fork) to `records` as the command ends: a free worker runs another."""
    import quinebox.cli.workers as workers
    from quinebox.cli import main

    plain = workers.worker
    last = [0.0, 0.0]  # in each forked worker, its own copy

    def worker(*args, **kwargs):  # type: ignore[no-untyped-def]
        code = plain(*args, **kwargs)
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        now = [own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime]
        line = f"{now[0] - last[0]} {now[1] - last[1]}\n".encode()
        last[:] = now
        fd = os.open(records, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, line)
        os.close(fd)
        return code

    workers.worker = worker
    sys.argv = ["quinebox", "serve", "--pool", pool]
    main()


def stat(pid: int) -> tuple[int, float, float]:
    """(parent, own CPU, reaped children's CPU) of `pid`, in seconds."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, (int(fields[13]) + int(fields[14])) / TICK


def tree_cpu(root: int) -> float:
    """The CPU of every live process under this one, and of the ones they reaped (not this process's own)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent, own, kids = stat(int(entry))
            except (OSError, ValueError):
                continue
            parents[int(entry)], cpu[int(entry)] = parent, own + kids
    total = 0.0
    for pid in parents:
        up = parents[pid]
        while up > 1 and up != root:
            up = parents.get(up, 0)
        if up == root:
            total += cpu[pid]
    return total


class Orphans:
    """What the server's tree leaves to this subreaper: reaped, and their CPU counted."""

    def __init__(self, keep: set[int]) -> None:
        self.keep = keep
        self.cpu = 0.0

    def reap(self) -> None:
        while True:
            try:
                pid, _, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.cpu += usage.ru_utime + usage.ru_stime


def ask(env: dict[str, str]) -> dict:
    done = subprocess.run([QUINEBOX, "serve", "status", "--json"], env=env, capture_output=True, timeout=60)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def refilled(env: dict[str, str], size: int, timeout: float = 120.0) -> dict:
    """What the server says once its pool holds `size` warm boxes of every shape (at once with no pool)."""
    if not size:
        return ask(env)
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        said = ask(env)
        shapes = ((said.get("pool") or {}).get("shapes")) or []
        if shapes and all(shape["warm"] >= size for shape in shapes):
            return said
        time.sleep(0.3)
    raise SystemExit("the pool did not refill in time")


def client(env: dict[str, str]) -> float:
    """One `quinebox exec -- true`; its own CPU (it starts no process of its own)."""
    proc = subprocess.Popen([QUINEBOX, "exec", "--", "true"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        assert proc.stderr is not None
        raise SystemExit(f"quinebox exec -- true exited {proc.returncode}: {proc.stderr.read().decode(errors='replace')[-400:]}")
    assert proc.stderr is not None
    proc.stderr.close()
    return usage.ru_utime + usage.ru_stime


def records(path: str) -> list[tuple[float, float]]:
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [(float(a), float(b)) for a, b in (line.split() for line in lines)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execs", type=int, default=100)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--backend", help="QUINEBOX_BACKEND for the server and its clients (default: as set, else auto)")
    parser.add_argument("--hooked-serve", metavar="RECORDS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hooked_serve:
        hooked_serve(args.hooked_serve, str(args.pool))
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    state = tempfile.mkdtemp(prefix="quinebox-bench-cpu-")
    log = os.path.join(state, "records")
    env = {**os.environ, "QUINEBOX_STATE_DIR": os.path.join(state, "state"), "QUINEBOX_SERVE": "manual"}
    env.pop("QUINEBOX_POOL", None)
    if args.backend:
        env["QUINEBOX_BACKEND"] = args.backend
    # As a user's install runs: with its modules' bytecode cached. Without, every thin client compiles client.py, fdpass.py
    # and state.py from source, ~8 ms of its ~18 (PYTHONDONTWRITEBYTECODE=1 in a session's environment, and a pyc older
    # than its source: stale, read never).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    server = subprocess.Popen([sys.executable, __file__, "--hooked-serve", log, "--pool", str(args.pool)], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(os.path.join(state, "serve.log"), "wb"))
    orphans = Orphans({server.pid})
    me = os.getpid()
    try:
        until = time.monotonic() + 120
        while not ask(env):
            if time.monotonic() > until or server.poll() is not None:
                raise SystemExit(f"the server did not answer: {Path(state, 'serve.log').read_text()[-400:]}")
            time.sleep(0.3)
        for _ in range(max(args.batch, 5)):  # the pool starts after a few commands; its shape is known after the first
            client(env)
        said = refilled(env, args.pool)
        keeper = int(said["pool"]["pid"]) if args.pool else None
        clients: list[float] = []
        parts: dict[str, list[float]] = {"server": [], "pool keeper": [], "runtime+box": [], "total (no client)": []}
        done = len(records(log))
        while len(clients) < args.execs:
            n = min(args.batch, args.execs - len(clients))
            orphans.reap()
            tree0, orphan0 = tree_cpu(me), orphans.cpu
            server0, keeper0 = stat(server.pid)[1], stat(keeper)[1] if keeper else 0.0
            for _ in range(n):
                clients.append(client(env))
            until = time.monotonic() + 60
            while len(records(log)) < done + n and time.monotonic() < until:
                time.sleep(0.05)
            ours = records(log)[done:done + n]
            done += n
            refilled(env, args.pool)
            time.sleep(0.3)  # the last refill's box settles (with no pool: the last box's remains go)
            orphans.reap()
            total = tree_cpu(me) - tree0 + orphans.cpu - orphan0
            server_cpu = stat(server.pid)[1] - server0 + sum(own for own, _ in ours)
            keeper_cpu = stat(keeper)[1] - keeper0 if keeper else 0.0
            parts["server"].append(server_cpu / n)
            parts["pool keeper"].append(keeper_cpu / n)
            parts["runtime+box"].append((total - server_cpu - keeper_cpu) / n)
            parts["total (no client)"].append(total / n)
        print(f"cores: {os.cpu_count()}; {args.execs} × `quinebox exec -- true` through the server, pool {args.pool}, batches of {args.batch}, "
              f"backend {env.get('QUINEBOX_BACKEND', 'auto')}")
        print(f"{'part':<20}{'CPU ms/exec (median)':>22}{'min':>8}{'max':>8}")
        rows = {"client": clients, **parts}
        for name, values in rows.items():
            print(f"{name:<20}{statistics.median(values) * 1000:>22.1f}{min(values) * 1000:>8.1f}{max(values) * 1000:>8.1f}")
        whole = statistics.median(clients) + statistics.median(parts["total (no client)"])
        print(f"{'client to exit':<20}{whole * 1000:>22.1f}")
    finally:
        subprocess.run([QUINEBOX, "serve", "stop"], env=env, capture_output=True, timeout=120)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
