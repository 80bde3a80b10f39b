"""The web view (`quinebox view`) in Debian's headless Chromium, over real runs in a state dir of its own.

    .venv/bin/python bench/view.py [--runs 5] [--inputs 200] [--parallel 8] [--agents 16]

1. Time to first paint of the 36-session tree's page (#/s/ROOT): navigation start to
   window.quineboxPaint, each in a fresh browser context (cold cache).          target ≤ 1 s
2. The same for the page of a `map` over 200 inputs (#/r/RUN).                 target ≤ 1 s
3. The view server's RSS (VmRSS of its process and its children) while 16 agents
   run at once and the page follows them: one page on their parent's tree, one
   on each agent's own session.                                                target ≤ 150 MB
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from measure import backend, run_child

ROOT = Path(__file__).resolve().parents[1]
QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--mute-audio"]
PAINT_TARGET_S = 1.0
RSS_TARGET_MB = 150
#: Every wait here ends; a figure from a wedged run would be a lie.
DEADLINE = 600.0


def script(work: Path, name: str, *turns: dict) -> str:
    (work / f"{name}.yaml").write_text(json.dumps({"turns": list(turns)}))
    return f"script:{work / name}.yaml"


class View:
    """`quinebox view --port 0` on the benchmark's state dir; stopped by its PID."""

    def __init__(self, env: dict[str, str]):
        self.proc = subprocess.Popen([QUINEBOX, "view", "--port", "0"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        said, until = b"", time.monotonic() + 60
        while b"\n" not in said and time.monotonic() < until and self.proc.poll() is None:
            if select.select([self.proc.stdout], [], [], 0.2)[0]:
                said += os.read(self.proc.stdout.fileno(), 4096) or b"\n"
        found = re.search(r"quinebox view: (http://\S+?)/\?token=(\S+)", said.decode(errors="replace"))
        if not found:
            self.stop()
            raise SystemExit(f"quinebox view printed no URL within 60 s: {said!r}")
        self.url = f"{found.group(1)}/?token={found.group(2)}"

    def rss_kib(self) -> int:
        """VmRSS of the server and every process below it."""
        total, todo = 0, [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                with open(f"/proc/{pid}/status") as f:
                    total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/children") as f:
                        todo += [int(child) for child in f.read().split()]
            except (OSError, ValueError):
                continue
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)


def first_paint_s(chromium, url: str, ready: str) -> float:
    """Seconds from navigation start to the route's first complete render, in a fresh context (nothing cached)."""
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(60_000)
    try:
        page = context.new_page()
        page.goto(url)
        page.wait_for_selector('body[data-ready="1"]', state="attached")
        page.wait_for_function(f"() => typeof window.quineboxPaint === 'number' && {ready}")
        return page.evaluate("() => window.quineboxPaint") / 1000
    finally:
        context.close()


def newest_session(env: dict[str, str], mission: str, within: float = 120) -> str:
    until = time.monotonic() + within
    while time.monotonic() < until:
        db = Path(env["QUINEBOX_STATE_DIR"]) / "sessions.db"
        if db.exists():
            import sqlite3

            with sqlite3.connect(db, timeout=30) as conn:
                row = conn.execute("SELECT id FROM sessions WHERE mission = ? ORDER BY started DESC LIMIT 1", (mission,)).fetchone()
            if row:
                return row[0]
        time.sleep(0.1)
    raise SystemExit(f"no session for {mission!r} within {within:g} s")


def running_children(env: dict[str, str], parent: str) -> list[str]:
    import sqlite3

    with sqlite3.connect(Path(env["QUINEBOX_STATE_DIR"]) / "sessions.db", timeout=30) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM sessions WHERE parent = ? AND ended IS NULL", (parent,))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="first paints measured per page")
    parser.add_argument("--inputs", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=8, help="-P of the map")
    parser.add_argument("--agents", type=int, default=16)
    args = parser.parse_args()
    if not os.access(CHROMIUM, os.X_OK):
        raise SystemExit(f"no {CHROMIUM}: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    state = tempfile.mkdtemp(prefix="quinebox-bench-view-")
    work = Path(tempfile.mkdtemp(prefix="quinebox-bench-view-work-"))
    env = {**os.environ, "QUINEBOX_STATE_DIR": state}
    env["QUINEBOX_SERVE"] = "manual"
    view = None
    try:
        print(f"boxes on {backend()}; Chromium {CHROMIUM}\n")
        tree = run_child([QUINEBOX, "run", "-q", "-m", f"script:{ROOT / 'examples' / 'tree' / 'root.yaml'}", "-g", "spawn:35", "-g", "depth:2",
                          "Survey the ten regions"], env=env)
        tree_root = newest_session(env, "Survey the ten regions")
        inputs = work / "inputs"
        inputs.mkdir()
        for i in range(args.inputs):
            (inputs / f"in{i:03d}.txt").write_text(f"input {i}\n")
        trivial = script(work, "trivial", {"exit": "success"})
        mapped = run_child([QUINEBOX, "map", "say nothing", *sorted(str(p) for p in inputs.iterdir()), "-m", trivial, "-o", str(work / "out"),
                            "-P", str(args.parallel)], env=env)
        view = View(env)
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60_000)
            try:
                run_id = runs_newest(chromium, view.url)
                first_paint_s(chromium, view.url + f"#/s/{tree_root}", "true")  # the server's own first answers (imports, caches) are not the page's
                tree_paints = [first_paint_s(chromium, view.url + f"#/s/{tree_root}", "document.querySelectorAll('#tree .node').length >= 36") for _ in range(args.runs)]
                map_ready = f"document.querySelectorAll('#run-inputs tr.input').length >= {args.inputs}"
                map_paints = [first_paint_s(chromium, view.url + f"#/r/{run_id}", map_ready) for _ in range(args.runs)]
                idle_mb = view.rss_kib() / 1024
                peak_mb, median_mb, agents = follow(chromium, view, env, work, args.agents)
            finally:
                chromium.close()
        print(f"{'36-session tree (the run itself)':<52} {tree.seconds:6.2f} s")
        print(f"{f'map of {args.inputs} inputs at -P{args.parallel} (the run itself)':<52} {mapped.seconds:6.2f} s")
        print(f"{'first paint, 36-session tree page':<52} {statistics.median(tree_paints):6.3f} s  median of {len(tree_paints)}  (target ≤ {PAINT_TARGET_S:g} s)")
        print(f"{f'first paint, map of {args.inputs} inputs page':<52} {statistics.median(map_paints):6.3f} s  median of {len(map_paints)}  (target ≤ {PAINT_TARGET_S:g} s)")
        print(f"{'view server RSS, idle after the paints':<52} {idle_mb:6.1f} MB")
        print(f"{f'view server RSS following {agents} running agents':<52} {peak_mb:6.1f} MB peak, {median_mb:.1f} MB median  (target ≤ {RSS_TARGET_MB} MB)")
        return 0
    finally:
        if view is not None:
            view.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def runs_newest(chromium, url: str) -> str:
    """The newest run's id, as the runs page lists it."""
    context = chromium.new_context()
    context.set_default_timeout(60_000)
    try:
        page = context.new_page()
        page.goto(url + "#/runs")
        page.wait_for_selector("table#runs tbody tr.run")
        return page.eval_on_selector("table#runs tbody tr.run", "e => e.dataset.run")
    finally:
        context.close()


def follow(chromium, view: View, env: dict[str, str], work: Path, agents: int) -> tuple[float, float, int]:
    """RSS samples of the view server while `agents` children of one parent run at once (each sleeps in sh), with a page
    on the parent and one on each child, every page in a context of its own (a browser holds 6 connections per host per
    context, and each page keeps an event stream open)."""
    sleeper = script(work, "sleeper", {"sh": "sleep 30; echo rested >&4"}, {"exit": "success"})
    child = {"mission": "rest a while", "material": "", "model": f"script:{Path(sleeper[len('script:'):]).name}"}  # beside the parent's script
    parent = script(work, "parent", {"fork": {"mode": "wait", "children": [child] * agents}}, {"exit": "success"})
    mission = f"start {agents} resting agents"
    run = subprocess.Popen([QUINEBOX, "run", "-q", "-m", parent, "-g", f"spawn:{agents}", "-g", "depth:1", mission], env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    contexts = []
    samples: list[int] = []
    try:
        root = newest_session(env, mission)
        until = time.monotonic() + 120
        while len(children := running_children(env, root)) < agents and time.monotonic() < until and run.poll() is None:
            time.sleep(0.2)
        if len(children) < agents:
            raise SystemExit(f"only {len(children)} of {agents} agents started within 120 s: {run.stderr.read().decode(errors='replace')[-500:] if run.poll() is not None else ''}")
        for route in [f"#/s/{root}", *(f"#/s/{c}" for c in children)]:
            context = chromium.new_context(viewport={"width": 1280, "height": 800})
            context.set_default_timeout(60_000)
            page = context.new_page()
            page.goto(view.url + route)
            page.wait_for_selector('body[data-ready="1"]', state="attached")
            contexts.append(context)
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                samples.append(view.rss_kib())
                stop.wait(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            _, err = run.communicate(timeout=DEADLINE)
        finally:
            stop.set()
            sampler.join(timeout=10)
        if run.returncode != 0:
            raise SystemExit(f"the {agents} agents' run exited {run.returncode}: {err.decode(errors='replace')[-500:]}")
        last = contexts[0].pages[0]
        last.wait_for_selector(f'#tree .node[data-session="{root}"][data-state="done"]')  # the page did follow to the end
    finally:
        for context in contexts:
            context.close()
        if run.poll() is None:
            os.kill(run.pid, signal.SIGTERM)
            run.wait(timeout=60)
    return max(samples) / 1024, statistics.median(samples) / 1024, agents


if __name__ == "__main__":
    sys.exit(main())
