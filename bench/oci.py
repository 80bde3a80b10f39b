"""The OCI-runtime backend (runc, and runsc = gVisor) side by side with the Docker engine, in one run.

    .venv/bin/python bench/oci.py [--runs 20] [--rounds 3] [--boxes 200] [--quick]

Interleaved (the order rotating each round), each `--runs` times (batches
`--rounds` times); medians quoted, each figure as a ratio against its baseline.
"Through serve" is the command server with its warm pool (the default: 4 boxes
per shape; the boxes are started ahead, and the client's own stdio is handed to
a warm box's init):

1. `quinebox exec -- true` through `quinebox serve` on the OCI backend (runc) vs
   `docker run --rm --network none IMAGE true`.      target: ≤ 0.15× docker run
   The cold CLI (QUINEBOX_SERVE=off, no server) on each backend and a box of the
   host's own root (`exec --image host -- true`, runc, cold) are reported beside.
2. `quinebox.exec(["true"])` in this process with the user's server up (it claims
   from the pool) vs docker-py's `containers.run(IMAGE, "true", remove=True,
   network_mode="none")`.                             target: ≤ 0.15×
   The same with no server (every box cold) is reported beside it.
3. throughput: `--boxes` × `quinebox exec -- true` at `xargs -P8` through serve vs
   the same number of `docker run --rm --network none IMAGE true` at -P8, each
   batch one `seq N | xargs -P8` run.                 target: ≥ 5× the boxes/s
   The cold CLI's batch is reported beside it.
4. 1 GiB of `head -c 1G /dev/zero` through `quinebox exec -- cat` into
   /dev/null (OCI backend, cold): the rate, box start included,
                                                     target: ≥ 1 GiB/s
   and the host quinebox process's peak RSS (wait4's ru_maxrss: the CLI, or
   the largest process it reaped).                   target: ≤ 50 MB
5. a gVisor box: `quinebox exec -- true` with QUINEBOX_RUNTIME=runsc through
   serve (warm gVisor boxes) vs `docker run`.        target: ≤ 0.5×
   (the cold CLI's figure is reported beside it).

`--quick`: 5 runs, 1 round, 40 boxes, 256 MiB. Everything runs in a state dir
of its own (a temporary directory, removed at the end), never the user's; each
command runs once to warm up first (the first OCI box of a state dir unpacks
the image). Every command has a deadline, and one that fails or overruns stops
the benchmark with the last lines of its stderr: a figure from a failed run
would be a lie (the figures measured until then are still printed).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator

import docker

from quinebox.box.spec import DEFAULT_IMAGE

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
DOCKER = shutil.which("docker") or "docker"
PARALLEL = 8
GIB = 1 << 30
#: Deadlines, in seconds: one box (the first OCI box of a state dir unpacks the image), one in-process call.
ONE_BOX = 90.0
IN_PROCESS = 90.0


class Failed(Exception):
    """A command failed or overran: the benchmark stops, no figure is made of it."""


@dataclass(frozen=True)
class Measured:
    seconds: float
    peak_kib: int


@dataclass
class Row:
    figure: str
    value: str
    against: str = ""  # the ratio and its target, or ""
    met: bool | None = None  # None: reported, no target


def last_lines(err: IO[bytes], count: int = 8) -> str:
    err.seek(0)
    lines = err.read().decode(errors="replace").rstrip().splitlines()[-count:]
    return "\n".join(f"    | {line}" for line in lines) or "    | (nothing on stderr)"


def measure(argv: list[str], env: dict[str, str], *, timeout: float, feed: list[str] | None = None, user: tuple[int, int] | None = None) -> Measured:
    """Run `argv` with stdout discarded and stdin from `feed`'s stdout (a producer command) or /dev/null.

    Wall time from the start (of the producer, with `feed`) to `argv`'s exit, and `argv`'s peak RSS (wait4).
    With `user` (uid, gid), `argv` runs as that user, with no supplementary groups (Popen's own switch: no
    runuser or sudo on the measured path). Failed when it exits non-zero or outlives `timeout` (its process
    group is then stopped: TERM, then KILL)."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as feed_err:
        began = time.perf_counter()
        producer = subprocess.Popen(feed, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=feed_err, env=env) if feed else None
        try:
            switch = {"user": user[0], "group": user[1], "extra_groups": []} if user else {}
            proc = subprocess.Popen(
                argv, stdin=producer.stdout if producer else subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True,
                **switch,  # type: ignore[arg-type]  # Popen's user/group/extra_groups, typed per keyword
            )
        finally:
            if producer:
                producer.stdout.close()  # the consumer holds it now: the producer sees EPIPE if the consumer goes
        overran = threading.Event()

        def stop() -> None:
            overran.set()
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                if proc.returncode is not None:
                    return
                time.sleep(5)

        timer = threading.Timer(timeout, stop)
        timer.daemon = True
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        seconds = time.perf_counter() - began
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        said = " ".join(argv[:6]) + (" …" if len(argv) > 6 else "")
        if feed:
            said = f"{' '.join(feed)} | {said}"
            try:
                fed = producer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                producer.kill()
                producer.wait()
                fed = "still running"
            if fed != 0 and not overran.is_set() and code == 0:
                raise Failed(f"{' '.join(feed)} exited {fed}:\n{last_lines(feed_err)}")
        if overran.is_set():
            raise Failed(f"{said} overran its {timeout:.0f} s and was stopped:\n{last_lines(err)}")
        if code != 0:
            raise Failed(f"{said} exited {code}:\n{last_lines(err)}")
    return Measured(seconds, usage.ru_maxrss)


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """An in-process call that outlives `seconds` is interrupted (SIGALRM) and fails the benchmark."""

    def overrun(signum: int, frame: object) -> None:
        raise Failed(f"{what} overran its {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, overrun)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def command(argv: list[str], env: dict[str, str], *, timeout: float = ONE_BOX, feed: list[str] | None = None,
            user: tuple[int, int] | None = None) -> Callable[[], Measured]:
    return lambda: measure(argv, env, timeout=timeout, feed=feed, user=user)


def compare(sides: dict[str, Callable[[], Measured]], runs: int) -> dict[str, list[Measured]]:
    """Each side once to warm up (not counted), then `runs` times, interleaved with the order rotating."""
    def once(name: str) -> Measured:
        try:
            return sides[name]()
        except Failed as exc:
            raise Failed(f"{name}: {exc}") from None

    for name in sides:
        once(name)
    measured: dict[str, list[Measured]] = {name: [] for name in sides}
    order = list(sides)
    for index in range(runs):
        shift = index % len(order)
        for name in order[shift:] + order[:shift]:
            measured[name].append(once(name))
    return measured


def median_s(values: list[Measured]) -> float:
    return statistics.median(m.seconds for m in values)


def verdict(met: bool) -> str:
    return "ok" if met else "MISSED"


def table(rows: list[Row]) -> None:
    print("\nsummary")
    width = max((len(row.figure) for row in rows), default=10)
    value_width = max((len(row.value) for row in rows), default=10)
    for row in rows:
        mark = "" if row.met is None else f"  {verdict(row.met)}"
        print(f"  {row.figure:<{width}}  {row.value:>{value_width}}  {row.against}{mark}")


@functools.cache
def engine_client() -> docker.DockerClient:
    """One docker-py client for every call (as a user keeps one): its version handshake is no call's cost."""
    return docker.from_env(timeout=60)


def docker_py() -> Measured:
    """docker-py's `containers.run(IMAGE, "true", remove=True, network_mode="none")`, timed in this process."""
    with deadline(IN_PROCESS, "containers.run(IMAGE, 'true')"):
        began = time.perf_counter()
        try:
            engine_client().containers.run(DEFAULT_IMAGE, "true", remove=True, network_mode="none")
        except docker.errors.DockerException as exc:
            raise Failed(f"containers.run(IMAGE, 'true') failed: {exc}") from exc
        return Measured(time.perf_counter() - began, 0)


def stopped(rows: list[Row], exc: Failed) -> int:
    """A benchmark's end at a failed run: the figures made until then, and why it stopped."""
    if rows:
        table(rows)
    sys.stdout.flush()
    print(f"\nstopped, no figure made of a failed run: {exc}", file=sys.stderr)
    return 1


def verdicts(rows: list[Row]) -> int:
    """The summary table and how many targets were missed; the exit status (1 when any was)."""
    table(rows)
    missed = [row.figure for row in rows if row.met is False]
    print(f"\n{len(missed)} of {sum(row.met is not None for row in rows)} targets missed" if missed else "\nevery target met")
    return 1 if missed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, help="runs of each single-box side (default 20; --quick 5)")
    parser.add_argument("--rounds", type=int, help="rounds of the batches, 3 and 4 (default 3; --quick 1)")
    parser.add_argument("--boxes", type=int, help="boxes per throughput batch (default 200; --quick 40)")
    parser.add_argument("--quick", action="store_true", help="5 runs, 1 round, 40 boxes, 256 MiB")
    args = parser.parse_args()
    runs = args.runs or (5 if args.quick else 20)
    rounds = args.rounds or (1 if args.quick else 3)
    boxes = args.boxes or (40 if args.quick else 200)
    size = 256 << 20 if args.quick else GIB

    work = Path(tempfile.mkdtemp(prefix="quinebox-bench-oci-"))
    base = {**os.environ, "QUINEBOX_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "config")}
    for name in ("QUINEBOX_POOL", "QUINEBOX_BACKEND", "QUINEBOX_RUNTIME"):
        base.pop(name, None)
    base["QUINEBOX_SERVE"] = "off"  # every quinebox side starts its box cold, with no server in between
    oci = {**base, "QUINEBOX_BACKEND": "oci", "QUINEBOX_RUNTIME": "runc"}
    on_docker = {**base, "QUINEBOX_BACKEND": "docker"}
    gvisor = {**base, "QUINEBOX_BACKEND": "oci", "QUINEBOX_RUNTIME": "runsc"}
    served = {**oci, "QUINEBOX_SERVE": "manual"}  # the thin client hands each command to the server it started
    started = subprocess.run([QUINEBOX, "serve", "--background"], env=served, capture_output=True, timeout=60)
    if started.returncode != 0:
        print(f"quinebox serve did not start: {started.stderr.decode(errors='replace')}", file=sys.stderr)
        return 1
    os.environ.update(served)  # the API's side below runs in this process, on the OCI backend, the user's server up
    docker_run = [DOCKER, "run", "--rm", "--network", "none", DEFAULT_IMAGE, "true"]
    exec_true = [QUINEBOX, "exec", "--", "true"]
    rows: list[Row] = []
    print(f"image {DEFAULT_IMAGE}, state dir {work / 'state'}, {runs} runs, {rounds} round(s) of the batches, {os.cpu_count()} cores\n")
    try:
        # 1. the cold CLI on each backend vs docker run
        first = compare({"cold CLI, OCI (runc)": command(exec_true, oci), "through serve, OCI (runc)": command(exec_true, served),
                         "cold CLI, Docker backend": command(exec_true, on_docker), "docker run": command(docker_run, base),
                         "cold CLI, --image host (runc)": command([QUINEBOX, "exec", "--image", "host", "--", "true"], oci)}, runs)
        ms = {name: median_s(values) * 1000 for name, values in first.items()}
        print(f"1. exec -- true, {runs} runs each, interleaved, medians")
        for name, value in ms.items():
            print(f"   {name:<40} {value:7.1f} ms")
        ratio, beside = ms["cold CLI, OCI (runc)"] / ms["docker run"], ms["cold CLI, Docker backend"] / ms["docker run"]
        through = ms["through serve, OCI (runc)"] / ms["docker run"]
        host = ms["cold CLI, --image host (runc)"] / ms["docker run"]
        print(f"   through serve / docker run {through:.2f} (target ≤ 0.15)   cold CLI {ratio:.2f}   Docker backend / docker run {beside:.2f}"
              f"   --image host / docker run {host:.2f} (all three reported)")
        rows += [
            Row("1. exec -- true, through serve, OCI (runc)", f"{ms['through serve, OCI (runc)']:.1f} ms", f"{through:.2f}× docker run (target ≤ 0.15×)", through <= 0.15),
            Row("1. exec -- true, cold CLI, OCI (runc)", f"{ms['cold CLI, OCI (runc)']:.1f} ms", f"{ratio:.2f}× docker run (reported)"),
            Row("1. exec -- true, cold CLI, Docker backend", f"{ms['cold CLI, Docker backend']:.1f} ms", f"{beside:.2f}× docker run (reported)"),
            Row("1. exec --image host -- true, cold CLI, runc", f"{ms['cold CLI, --image host (runc)']:.1f} ms", f"{host:.2f}× docker run (reported)"),
            Row("1. docker run --rm --network none … true", f"{ms['docker run']:.1f} ms", "baseline"),
        ]

        # 2. the Python API in this process vs docker-py
        import quinebox

        def api(pool: bool) -> Callable[[], Measured]:
            def call() -> Measured:
                os.environ["QUINEBOX_POOL"] = "auto" if pool else "off"
                with deadline(IN_PROCESS, "quinebox.exec(['true'])"):
                    began = time.perf_counter()
                    done = quinebox.exec(["true"])
                    seconds = time.perf_counter() - began
                if done.returncode != 0:
                    raise Failed(f"quinebox.exec(['true']) gave {done.returncode}:\n    | " + "\n    | ".join(done.stderr.decode(errors="replace").splitlines()[-8:]))
                return Measured(seconds, 0)

            return call

        second = compare({"quinebox.exec, OCI (runc), pool": api(True), "quinebox.exec, OCI (runc), cold": api(False), "docker-py containers.run": docker_py}, runs)
        os.environ.pop("QUINEBOX_POOL", None)
        ms = {name: median_s(values) * 1000 for name, values in second.items()}
        print(f"\n2. the Python API, in this process, {runs} runs each (after one warm-up call), interleaved, medians")
        for name, value in ms.items():
            print(f"   {name:<40} {value:7.1f} ms")
        ratio = ms["quinebox.exec, OCI (runc), pool"] / ms["docker-py containers.run"]
        cold = ms["quinebox.exec, OCI (runc), cold"] / ms["docker-py containers.run"]
        print(f"   quinebox.exec / containers.run {ratio:.2f} with the server's pool (target ≤ 0.15), {cold:.2f} cold (reported)")
        rows += [
            Row("2. quinebox.exec(['true']), OCI (runc), server up", f"{ms['quinebox.exec, OCI (runc), pool']:.1f} ms", f"{ratio:.2f}× containers.run (target ≤ 0.15×)", ratio <= 0.15),
            Row("2. quinebox.exec(['true']), OCI (runc), no server", f"{ms['quinebox.exec, OCI (runc), cold']:.1f} ms", f"{cold:.2f}× containers.run (reported)"),
            Row("2. docker-py containers.run(…, 'true')", f"{ms['docker-py containers.run']:.1f} ms", "baseline"),
        ]

        # 3. throughput at -P8
        count = ["seq", str(boxes)]
        batch = 60 + boxes * 3.0
        xargs = ["xargs", f"-P{PARALLEL}", "-I{}"]
        third = compare({"quinebox exec -- true, OCI (runc)": command(xargs + exec_true, oci, timeout=batch, feed=count),
                         "same, through serve": command(xargs + exec_true, served, timeout=batch, feed=count),
                         "docker run --rm … true": command(xargs + docker_run, base, timeout=batch, feed=count)}, rounds)
        rate = {name: boxes / median_s(values) for name, values in third.items()}
        print(f"\n3. throughput: {boxes} boxes at xargs -P{PARALLEL}, {rounds} round(s) each (after one warm-up batch), interleaved, medians")
        for name, values in third.items():
            print(f"   {name:<40} {median_s(values):7.2f} s   {rate[name]:6.2f} boxes/s")
        ours, served_rate, theirs = rate["quinebox exec -- true, OCI (runc)"], rate["same, through serve"], rate["docker run --rm … true"]
        print(f"   throughput ratio {served_rate / theirs:.2f} through serve (target ≥ 5), {ours / theirs:.2f} cold (reported)")
        rows += [
            Row(f"3. {boxes} × exec -- true at -P{PARALLEL}, through serve, OCI (runc)", f"{served_rate:.2f} boxes/s", f"{served_rate / theirs:.2f}× docker run (target ≥ 5×)", served_rate / theirs >= 5),
            Row("3. the same, cold CLI, OCI (runc)", f"{ours:.2f} boxes/s", f"{ours / theirs:.2f}× docker run (reported)"),
            Row(f"3. {boxes} × docker run at -P{PARALLEL}", f"{theirs:.2f} boxes/s", "baseline"),
        ]

        # 4. a stream through the box
        stream = compare({"cat": command([QUINEBOX, "exec", "--", "cat"], oci, timeout=60 + size / GIB * 120, feed=["head", "-c", str(size), "/dev/zero"])}, rounds)
        seconds = median_s(stream["cat"])
        peak_mb = max(m.peak_kib for m in stream["cat"]) / 1024
        gibs = size / GIB / seconds
        start = statistics.median(m.seconds for m in first["cold CLI, OCI (runc)"])
        label = f"{size >> 20} MiB" if size < GIB else f"{size / GIB:g} GiB"
        print(f"\n4. {label} from head -c through quinebox exec -- cat into /dev/null, OCI (runc), {rounds} round(s) (after a warm-up), median")
        print(f"   {seconds:.2f} s   {gibs:.2f} GiB/s, box start included (target ≥ 1)"
              + (f"; {size / GIB / (seconds - start):.2f} GiB/s less the {start * 1000:.0f} ms of a box's start" if seconds > start else ""))
        print(f"   host quinebox peak RSS {peak_mb:.1f} MB (wait4 ru_maxrss, largest of the rounds; target ≤ 50)")
        rows += [
            Row(f"4. {label} through exec -- cat, OCI (runc)", f"{gibs:.2f} GiB/s", "target ≥ 1 GiB/s", gibs >= 1),
            Row("4. host quinebox peak RSS while streaming", f"{peak_mb:.1f} MB", "target ≤ 50 MB", peak_mb <= 50),
        ]

        # 5. gVisor
        gvisor_served = {**served, "QUINEBOX_RUNTIME": "runsc"}
        fifth = compare({"cold CLI, OCI (runsc)": command(exec_true, gvisor), "through serve, OCI (runsc)": command(exec_true, gvisor_served),
                         "docker run": command(docker_run, base)}, runs)
        ms = {name: median_s(values) * 1000 for name, values in fifth.items()}
        print(f"\n5. a gVisor box: exec -- true, {runs} runs each, interleaved, medians (the target is set through `quinebox serve`)")
        for name, value in ms.items():
            print(f"   {name:<40} {value:7.1f} ms")
        ratio = ms["cold CLI, OCI (runsc)"] / ms["docker run"]
        through = ms["through serve, OCI (runsc)"] / ms["docker run"]
        print(f"   runsc / docker run {ratio:.2f} cold, {through:.2f} through serve (target ≤ 0.5)")
        rows += [
            Row("5. exec -- true, cold CLI, OCI (runsc)", f"{ms['cold CLI, OCI (runsc)']:.1f} ms", f"{ratio:.2f}× docker run (reported)"),
            Row("5. exec -- true, through serve, OCI (runsc)", f"{ms['through serve, OCI (runsc)']:.1f} ms", f"{through:.2f}× docker run (target ≤ 0.5×)", through <= 0.5),
            Row("5. docker run (its own interleaved runs)", f"{ms['docker run']:.1f} ms", "baseline"),
        ]
    except Failed as exc:
        return stopped(rows, exc)
    finally:
        subprocess.run([QUINEBOX, "serve", "stop"], env=served, capture_output=True, timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    return verdicts(rows)


if __name__ == "__main__":
    sys.exit(main())
