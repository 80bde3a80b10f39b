"""Many boxes through one process, then a crowd held open at once: what is left behind, and how memory grows.

Shared by the short soak in CI (tests/integration/test_soak.py) and the long
one (bench/soak.py).
"""

from __future__ import annotations

import gc
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import docker

import quinebox
from quinebox.box.policy import LABEL_SESSION
from quinebox.state import run_dir, state_dir


def rss_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class Leftovers:
    containers: int
    volumes: int
    sessions: int
    sockets: int
    fds: int
    threads: int

    def none_beyond(self, before: "Leftovers") -> bool:
        """Nothing more than before; fewer fds is fine (docker-py's pools hold a varying few)."""
        return all(getattr(self, name) <= getattr(before, name) for name in ("containers", "volumes", "sessions", "sockets", "fds", "threads"))


@dataclass
class Report:
    boxes: int
    failed: int
    seconds: float
    rss_kib: list[int] = field(default_factory=list)  # after each `every` boxes
    before: Leftovers | None = None
    after: Leftovers | None = None


def leftovers(client: docker.DockerClient) -> Leftovers:
    sessions = state_dir() / "sessions"
    return Leftovers(
        containers=len(client.api.containers(all=True, filters={"label": LABEL_SESSION})),
        volumes=len(client.api.volumes(filters={"label": LABEL_SESSION}).get("Volumes") or []),
        sessions=len(list(sessions.iterdir())) if sessions.is_dir() else 0,
        sockets=len(list(run_dir().glob("*.sock"))),
        fds=len(os.listdir("/proc/self/fd")),
        threads=threading.active_count(),
    )


def settled(client: docker.DockerClient, baseline: Leftovers, timeout: float = 30) -> Leftovers:
    """What is left once the last boxes' removal and threads have had time to finish.

    docker-py's finished responses sit in reference cycles that hold their
    sockets until the next garbage collection; one collection must free them.
    """
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        now = leftovers(client)
        if now.none_beyond(baseline) or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def crowd(held: int, hold_s: float) -> int:
    """`held` boxes open at once for `hold_s` seconds, then killed; how many did not end as killed."""
    boxes = [quinebox.Popen(["sleep", "3600"], stdin=quinebox.DEVNULL, stdout=quinebox.DEVNULL) for _ in range(held)]
    time.sleep(hold_s)
    for box in boxes:
        box.kill()
    return sum(box.wait() != 137 for box in boxes)


def soak(total: int, parallel: int, held: int, hold_s: float, every: int = 100) -> Report:
    client = docker.from_env(timeout=60)
    # A warm-up of the same shape fills docker-py's connection pools (bounded,
    # kept per request URL), so what is counted after is what the boxes left.
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(lambda _: quinebox.exec(["true"]), range(parallel * 2)))
    crowd(held, 0)
    gc.collect()
    report = Report(boxes=total, failed=0, seconds=0.0, before=leftovers(client))
    began = time.monotonic()
    done = 0
    lock = threading.Lock()

    def one(_: int) -> int:
        nonlocal done
        code = quinebox.exec(["true"], timeout=120).returncode
        with lock:
            done += 1
            if done % every == 0:
                report.rss_kib.append(rss_kib())
        return code

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        report.failed = sum(code != 0 for code in pool.map(one, range(total)))
    report.failed += crowd(held, hold_s)
    report.seconds = time.monotonic() - began
    report.after = settled(client, report.before)
    return report
