"""Rootless boxes, as a user who is not root and may not use the engine, side by side with `docker run`, in one run.

    sudo .venv/bin/python bench/rootless.py [--user quinebox-rootless] [--python VENV/bin/python] [--runs 20] [--rounds 3] [--quick]

Run as root: root is the one here who may run `docker run` (the baseline), and it starts each of the
user's sides as that user (Popen's own uid/gid switch, no supplementary groups: no runuser or sudo on
the measured path). The user is one `quinebox setup-user NAME` has delegated a cgroup to, with no engine
access (scripts/test.sh makes `quinebox-rootless` so in CI); its boxes come from the shared image cache
(`quinebox image share`, which scripts/setup.sh runs). Its quinebox is `--python`'s venv (default this one),
which the user must be able to run: a venv of /usr/bin/python3 with quinebox installed, say, where this
one's interpreter is in root's home (`python3 -m venv /opt/qb && /opt/qb/bin/pip install -e .`). Interleaved, the order rotating each run; medians:

1. `quinebox exec -- true` as the user, the cold CLI (QUINEBOX_SERVE=off), vs root's
   `docker run --rm --network none IMAGE true`.       target: ≤ 1.0× docker run
   A box of the host's own root, `exec --image host -- true`, the same.
                                                     target: ≤ 1.0× docker run
   The same through the user's own `quinebox serve` (no pool): reported.
2. `quinebox.exec(["true"])` in one lasting Python process of the user's, vs `docker run`.
                                                     target: ≤ 0.25× docker run
   (docker-py's `containers.run` is reported beside it.)
3. 1 GiB of `head -c 1G /dev/zero` through the user's `quinebox exec -- cat` into /dev/null:
   the rate, box start included.                     target: ≥ 1 GiB/s
   and the user's quinebox process's peak RSS (wait4's ru_maxrss): reported.

`--quick`: 5 runs, 1 round, 256 MiB. The user's state dir, config and temporary files are in a
directory of its own (removed at the end); each side runs once to warm up first. Every command has a
deadline; one that fails or overruns stops the benchmark with its last words (see bench/oci.py).
"""

from __future__ import annotations

import argparse
import os
import pwd
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from oci import GIB, IN_PROCESS, Failed, Measured, Row, command, compare, docker_py, median_s, stopped, verdicts

from quinebox.box.spec import DEFAULT_IMAGE

DOCKER = shutil.which("docker") or "docker"

#: The user's lasting process for side 2: it says which backend its boxes go to, then times one
#: `quinebox.exec(["true"])` per line it reads and answers each with the seconds (or what failed).
WORKER = r"""
import sys, time
import quinebox
from quinebox.box.backends.choice import choose
choice = choose(None)
print(f"{choice.backend} {choice.runtime} {choice.why}".replace("\n", " "), flush=True)
for _ in sys.stdin:
    began = time.perf_counter()
    done = quinebox.exec(["true"])
    seconds = time.perf_counter() - began
    said = done.stderr.decode(errors="replace").strip().replace("\n", " | ")[-400:]
    print(seconds if done.returncode == 0 else f"failed {done.returncode}: {said}", flush=True)
"""


class Worker:
    """The user's lasting Python process (side 2): one line out per `quinebox.exec`, each with a deadline."""

    def __init__(self, python: str, env: dict[str, str], user: tuple[int, int]) -> None:
        self.proc = subprocess.Popen([python, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, user=user[0], group=user[1], extra_groups=[], text=True)
        self.backend = self.answer("the worker's start")

    def answer(self, what: str) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], IN_PROCESS)
        line = self.proc.stdout.readline().strip() if ready else ""
        if not line:
            raise Failed(f"{what}: the user's Python process {'overran' if not ready else 'ended'}")
        return line

    def __call__(self) -> Measured:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        said = self.answer("quinebox.exec(['true'])")
        if said.startswith("failed"):
            raise Failed(f"quinebox.exec(['true']) as the user {said}")
        return Measured(float(said), 0)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def the_user(name: str, python: str) -> tuple[int, int] | str:
    """The user's (uid, gid), or the one line saying why this benchmark cannot run as it (with `python`)."""
    if os.geteuid() != 0:
        return "run this as root: root runs the docker run baseline and starts the user's sides as the user"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return f"no user {name}: make one with no engine access and run `quinebox setup-user {name}` (scripts/test.sh does, with CI=true)"
    if entry.pw_uid == 0:
        return f"{name} is root: this benchmark is of a user who is not"
    user = entry.pw_uid, entry.pw_gid
    try:
        tried = subprocess.run([python, "-c", "import quinebox"], capture_output=True, timeout=60, user=user[0], group=user[1], extra_groups=[], cwd="/")
    except PermissionError:
        tried = None
    if tried is None or tried.returncode != 0:
        return f"{name} cannot run quinebox with {python}: give --python a venv it can read (see this file's docstring)"
    return user


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--user", default="quinebox-rootless", help="the user whose boxes are measured (default quinebox-rootless)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of a venv with quinebox that the user can run (default this one)")
    parser.add_argument("--runs", type=int, help="runs of each single-box side (default 20; --quick 5)")
    parser.add_argument("--rounds", type=int, help="rounds of the stream (default 3; --quick 1)")
    parser.add_argument("--quick", action="store_true", help="5 runs, 1 round, 256 MiB")
    args = parser.parse_args()
    runs = args.runs or (5 if args.quick else 20)
    rounds = args.rounds or (1 if args.quick else 3)
    size = 256 << 20 if args.quick else GIB
    user = the_user(args.user, args.python)
    if isinstance(user, str):
        print(f"bench/rootless.py: {user}", file=sys.stderr)
        return 2
    quinebox = str(Path(args.python).with_name("quinebox"))

    work = Path(tempfile.mkdtemp(prefix="qbr-bench-", dir="/tmp"))  # short: the user's sockets live under it
    for sub in ("home", "tmp", "state", "config"):
        (work / sub).mkdir()
    for path in (work, *work.iterdir()):
        os.chown(path, *user)
    served = {"PATH": f"{Path(args.python).parent}:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(work / "home"), "TMPDIR": str(work / "tmp"),
              "QUINEBOX_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "config"), "LANG": "C.UTF-8"}
    cold = {**served, "QUINEBOX_SERVE": "off"}
    root = {**os.environ, "QUINEBOX_SERVE": "off"}
    worker: Worker | None = None
    rows: list[Row] = []
    try:
        worker = Worker(args.python, cold, user)
        if not worker.backend.startswith("oci "):
            print(f"bench/rootless.py: {args.user}'s boxes would not be rootless OCI boxes: {worker.backend}", file=sys.stderr)
            return 2
        started = subprocess.run([quinebox, "serve", "--background", "--pool", "0"], env=served, capture_output=True, timeout=60,
                                 user=user[0], group=user[1], extra_groups=[])
        if started.returncode != 0:
            print(f"bench/rootless.py: {args.user}'s quinebox serve did not start: {started.stderr.decode(errors='replace')}", file=sys.stderr)
            return 1
        print(f"image {DEFAULT_IMAGE}, user {args.user} (uid {user[0]}), its boxes: {worker.backend}; {runs} runs, {os.cpu_count()} cores\n")
        exec_true = [quinebox, "exec", "--", "true"]
        docker_run = [DOCKER, "run", "--rm", "--network", "none", DEFAULT_IMAGE, "true"]

        # 1. the user's CLI vs root's docker run
        first = compare({"cold CLI, rootless": command(exec_true, cold, user=user),
                         "cold CLI, --image host, rootless": command([quinebox, "exec", "--image", "host", "--", "true"], cold, user=user),
                         "through serve, rootless": command(exec_true, served, user=user),
                         "docker run (root)": command(docker_run, root)}, runs)
        ms = {name: median_s(values) * 1000 for name, values in first.items()}
        print(f"1. exec -- true, {runs} runs each, interleaved, medians")
        for name, value in ms.items():
            print(f"   {name:<40} {value:7.1f} ms")
        ratio = {name: value / ms["docker run (root)"] for name, value in ms.items()}
        rows += [
            Row("1. exec -- true, cold CLI, rootless", f"{ms['cold CLI, rootless']:.1f} ms",
                f"{ratio['cold CLI, rootless']:.2f}× docker run (target ≤ 1.0×)", ratio["cold CLI, rootless"] <= 1.0),
            Row("1. exec --image host -- true, cold CLI, rootless", f"{ms['cold CLI, --image host, rootless']:.1f} ms",
                f"{ratio['cold CLI, --image host, rootless']:.2f}× docker run (target ≤ 1.0×)", ratio["cold CLI, --image host, rootless"] <= 1.0),
            Row("1. exec -- true, through serve, rootless", f"{ms['through serve, rootless']:.1f} ms",
                f"{ratio['through serve, rootless']:.2f}× docker run (reported)"),
            Row("1. docker run --rm --network none … true (root)", f"{ms['docker run (root)']:.1f} ms", "baseline"),
        ]

        # 2. the Python API in the user's lasting process vs docker run (and docker-py, reported)
        second = compare({"quinebox.exec, rootless": worker, "docker run (root)": command(docker_run, root),
                          "docker-py containers.run (root)": docker_py}, runs)
        ms = {name: median_s(values) * 1000 for name, values in second.items()}
        print(f"\n2. the Python API, in one process of the user's, {runs} runs each (after one warm-up call), interleaved, medians")
        for name, value in ms.items():
            print(f"   {name:<40} {value:7.1f} ms")
        api, beside = ms["quinebox.exec, rootless"] / ms["docker run (root)"], ms["quinebox.exec, rootless"] / ms["docker-py containers.run (root)"]
        rows += [
            Row("2. quinebox.exec(['true']), rootless", f"{ms['quinebox.exec, rootless']:.1f} ms", f"{api:.2f}× docker run (target ≤ 0.25×)", api <= 0.25),
            Row("2. the same against docker-py containers.run", f"{ms['docker-py containers.run (root)']:.1f} ms", f"{beside:.2f}× (reported)"),
        ]

        # 3. a stream through the user's box
        feed = ["head", "-c", str(size), "/dev/zero"]
        stream = compare({"cat": command([quinebox, "exec", "--", "cat"], cold, timeout=60 + size / GIB * 120, feed=feed, user=user)}, rounds)
        seconds = median_s(stream["cat"])
        peak_mb = max(m.peak_kib for m in stream["cat"]) / 1024
        gibs = size / GIB / seconds
        label = f"{size >> 20} MiB" if size < GIB else f"{size / GIB:g} GiB"
        print(f"\n3. {label} from head -c through the user's quinebox exec -- cat into /dev/null, {rounds} round(s) (after a warm-up), median")
        print(f"   {seconds:.2f} s   {gibs:.2f} GiB/s, box start included (target ≥ 1); its quinebox's peak RSS {peak_mb:.1f} MB")
        rows += [
            Row(f"3. {label} through exec -- cat, rootless", f"{gibs:.2f} GiB/s", "target ≥ 1 GiB/s", gibs >= 1),
            Row("3. the user's quinebox peak RSS while streaming", f"{peak_mb:.1f} MB", "reported"),
        ]
    except Failed as exc:
        return stopped(rows, exc)
    finally:
        if worker:
            worker.close()
        subprocess.run([quinebox, "serve", "stop"], env=served, capture_output=True, timeout=60, user=user[0], group=user[1], extra_groups=[])
        shutil.rmtree(work, ignore_errors=True)
    return verdicts(rows)


if __name__ == "__main__":
    sys.exit(main())
