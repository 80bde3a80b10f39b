"""The pictures of docs/view.md: the web view's main pages over real runs in a state dir of its own, taken by
Debian's headless Chromium at 1280x800.

    .venv/bin/python bench/view_screenshots.py [--out docs/img]

Writes view-sessions.png, view-tree.png (the 36-session tree with a leaf's transcript), view-world.png (a world
diff), view-run.png (a `map` run) and view-audit.png (the audit log with a request waiting for a person).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import run_child
from view import CHROMIUM, CHROMIUM_ARGS, QUINEBOX, ROOT, View, newest_session, runs_newest, script


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    state = tempfile.mkdtemp(prefix="quinebox-shots-")
    work = Path(tempfile.mkdtemp(prefix="quinebox-shots-work-"))
    work.chmod(0o755)
    env = {**os.environ, "QUINEBOX_STATE_DIR": state}
    env["QUINEBOX_SERVE"] = "manual"
    view = asking = None
    try:
        run_child([QUINEBOX, "run", "-q", "-m", f"script:{ROOT / 'examples' / 'tree' / 'root.yaml'}", "-g", "spawn:35", "-g", "depth:2",
                   "Survey the ten regions"], env=env)
        tree = newest_session(env, "Survey the ten regions")
        leaf = newest_session(env, "Survey district c")
        notes = "\n".join(f"line {i}" for i in range(1, 8)) + "\n"
        editor = script(
            work, "editor",
            {"say": "Writing the notes into the world.", "sh": "mkdir -p /world/notes && cat <&3 > /world/notes/today.txt && wc -l < /world/notes/today.txt"},
            {"say": "Now a summary beside them.", "sh": "sed -i 's/line 3/line three (checked)/' /world/notes/today.txt; echo '7 lines, one checked' > /world/notes/summary.txt"},
            {"sh": "cat /world/notes/summary.txt >&4"}, {"exit": "success"},
        )
        run_child([QUINEBOX, "run", "-q", "-m", editor, "Keep today's notes"], stdin=notes.encode(), env=env)
        edited = newest_session(env, "Keep today's notes")
        inputs = work / "reports"
        inputs.mkdir()
        for name in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"):
            (inputs / f"{name}.txt").write_text(f"report {name}\n" * 3)
        counter = script(work, "counter", {"sh": "wc -l <&3 >&4"}, {"exit": "success"})
        run_child([QUINEBOX, "map", "Count the report's lines", *sorted(str(p) for p in inputs.iterdir()), "-m", counter, "-o", str(work / "out"), "-P", "4"], env=env)
        child = script(work, "child", {"sh": "echo hello >&4"}, {"exit": "success"})
        parent = script(work, "parent", {"sh": f"quinebox run -q -m script:{Path(child[len('script:'):]).name} 'say hello' >&4"}, {"exit": "success"})
        asking = subprocess.Popen([QUINEBOX, "run", "-q", "-m", parent, "--ask", "spawn:1", "--ask-timeout", "120", "Delegate a greeting"], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        until = time.monotonic() + 60
        while time.monotonic() < until and not subprocess.run([QUINEBOX, "approvals", "--json"], env=env, capture_output=True, timeout=60).stdout:
            time.sleep(0.2)
        view = View(env)
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60_000)
            try:
                run_id = runs_newest(chromium, view.url)
                context = chromium.new_context(viewport={"width": 1280, "height": 800})
                context.set_default_timeout(60_000)
                page = context.new_page()

                def shot(route: str, name: str, *, then=None) -> None:
                    page.goto(view.url + route)
                    page.wait_for_selector('body[data-ready="1"]', state="attached")
                    if then:
                        then()
                    page.wait_for_timeout(400)
                    page.screenshot(path=str(out / f"view-{name}.png"))
                    print(out / f"view-{name}.png")

                shot("#/", "sessions")

                def pick_leaf():
                    page.wait_for_function("() => document.querySelectorAll('#tree .node').length >= 36")
                    page.click(f'#tree .node[data-session="{leaf}"] .label')
                    page.wait_for_selector(f'#transcript[data-session="{leaf}"] .entry')
                    page.evaluate("() => window.scrollTo(0, 0)")

                shot(f"#/s/{tree}", "tree", then=pick_leaf)

                def pick_revision():
                    if page.locator("#world-tab").count():
                        page.click("#world-tab")
                    page.wait_for_selector("#world .rev")
                    page.locator("#world .rev").last.click()
                    page.wait_for_function("() => (document.querySelector('pre#world-diff, #world-diff pre')?.textContent || '').length > 0")
                    page.locator("#world").scroll_into_view_if_needed()

                shot(f"#/s/{edited}", "world", then=pick_revision)
                shot(f"#/r/{run_id}", "run", then=lambda: page.wait_for_selector("#run-inputs tr.input"))
                shot("#/audit", "audit", then=lambda: page.wait_for_selector("#approvals .pending"))
                context.close()
            finally:
                chromium.close()
        return 0
    finally:
        if view is not None:
            view.stop()
        if asking is not None and asking.poll() is None:
            os.kill(asking.pid, signal.SIGTERM)
            asking.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
