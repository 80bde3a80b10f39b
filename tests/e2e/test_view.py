"""`quinebox view` in a real browser (Debian's headless Chromium, driven by Playwright) over real runs on the real
backend: the 36-session tree, transcripts, live state, approvals from the page, the token, the page's own network
log, and an export opened from disk (no secret on any page: test_view_secrets.py).

Every `quinebox view` and every run here is started by this module and stopped by its PID.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from commands import QUINEBOX, qb, scripts, wait_for
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from view_browser import go, no_foreign, open_page, view_server

from quinebox.agent.store import Index, read_tape
from quinebox.audit.log import AuditLog
from quinebox.state import state_dir

REPO = Path(__file__).resolve().parents[2]
TREE = REPO / "examples" / "tree"


@pytest.fixture(scope="module")
def tree() -> dict:
    """The README's 36-session demo, run once: its root and {session: parent} from the sessions index."""
    done = qb("run", "-q", "--json", "-m", f"script:{TREE / 'root.yaml'}", "-g", "spawn:35", "-g", "depth:2", "Survey the ten regions", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    root = json.loads(done.stderr.decode().splitlines()[-1])["session"]
    index = Index()
    try:
        rows = index.subtree(root)
    finally:
        index.close()
    assert len(rows) == 36
    return {"root": root, "parents": {row.id: row.parent or "" for row in rows}, "rows": {row.id: row for row in rows}}


@pytest.fixture(scope="module")
def mapped(tmp_path_factory) -> dict:
    """A small `map` run: three inputs, one scripted agent each."""
    here = tmp_path_factory.mktemp("map")
    scripts(here, upper=[{"sh": "tr a-z A-Z <&3 >&4"}, {"exit": "success"}])
    for name in ("a", "b", "c"):
        (here / f"{name}.txt").write_text(f"input {name}\n")
    out = here / "out"
    done = qb("map", "shout it", *(str(here / f"{n}.txt") for n in ("a", "b", "c")), "-m", f"script:{here / 'upper.yaml'}", "-o", str(out), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return {"out": out, "names": ["a.txt", "b.txt", "c.txt"]}


@pytest.fixture(scope="module")
def view(tree):
    with view_server() as server:
        yield server


def nodes(page) -> dict[str, str]:
    return page.eval_on_selector_all("#tree .node", "els => Object.fromEntries(els.map(e => [e.dataset.session, e.dataset.parent || '']))")


# -- (a) the tree ------------------------------------------------------------------------------------


def test_the_36_session_tree_has_36_nodes_with_their_parents(browser, view, tree):
    context, recorded = browser.context()
    try:
        page = open_page(context, view.page_url(f"#/s/{tree['root']}"), "session")
        page.wait_for_function("() => document.querySelectorAll('#tree .node').length >= 36")
        assert nodes(page) == tree["parents"]
        states = page.eval_on_selector_all("#tree .node", "els => els.map(e => e.dataset.state)")
        assert states == ["done"] * 36
        critical = page.eval_on_selector_all('#tree .node[data-critical="1"]', "els => els.map(e => e.dataset.session)")
        assert tree["root"] in critical and 2 <= len(critical) <= 3  # root → a splitting worker → one of its leaves
        # The same as the API says, and as `quinebox tree` prints.
        api = view.json(f"/api/sessions/{tree['root']}/tree")
        assert {n["id"]: n["parent"] or "" for n in api["nodes"]} == tree["parents"]
        printed = qb("tree", tree["root"]).stdout.decode()
        assert set(re.findall(r"\b[0-9a-f]{12}\b", printed)) == set(tree["parents"])
        no_foreign(recorded, view.origin)
    finally:
        context.close()


# -- (b) a node's transcript ---------------------------------------------------------------------------


def test_clicking_a_node_shows_that_agents_transcript(browser, view, tree):
    leaf = next(id for id, row in tree["rows"].items() if row.mission == "Survey district c")
    other = next(id for id, row in tree["rows"].items() if row.mission == "Survey region 7")
    context, recorded = browser.context()
    try:
        page = open_page(context, view.page_url(f"#/s/{tree['root']}"), "session")
        reads: list[str] = []  # the page's transcript reads and how each ended, said if the transcript never comes
        page.on("response", lambda r: "/transcript" in r.url and reads.append(f"{r.url.rpartition('/api/')[2]}: {r.status}"))
        page.on("requestfailed", lambda r: "/transcript" in r.url and reads.append(f"{r.url.rpartition('/api/')[2]}: failed {r.failure}"))
        page.wait_for_selector(f'#transcript[data-session="{tree["root"]}"] .entry')
        for chosen in (leaf, other):
            page.click(f'#tree .node[data-session="{chosen}"] .label')
            try:
                page.wait_for_selector(f'#transcript[data-session="{chosen}"] .entry[data-kind="outcome"]')
            except PlaywrightTimeout:
                raise AssertionError(f"no transcript of {chosen} came: the page shows {page.inner_text('#transcript')[:500]!r}, "
                                     f"its reads {reads}, its state {page.inner_text('#live')!r}") from None
            tape = read_tape(chosen)
            kinds = page.eval_on_selector_all("#transcript .entry", "els => els.map(e => e.dataset.kind)")
            tape_kinds = [r["kind"] for r in tape]
            assert kinds == tape_kinds, (kinds, tape_kinds)
            text = page.inner_text("#transcript")
            assert tree["rows"][chosen].mission in text
            for record in tape:
                if record["kind"] == "tool":  # the command as typed, or as the JSON of its arguments
                    command = record["args"]["command"]
                    assert command in text or json.dumps(command)[1:-1] in text, command
                    assert record["result"].splitlines()[0] in text
            assert "Survey region 1 by delegating" not in text  # the root's fork is not in a leaf's transcript
            assert "done" in page.inner_text("#node-summary") or "exit 0" in page.inner_text("#node-summary")
        assert page.loads == 1  # clicks never reload the page
        no_foreign(recorded, view.origin)
    finally:
        context.close()


# -- (c) live state ----------------------------------------------------------------------------------


def test_a_running_agent_changes_state_on_the_page_without_a_reload(browser, view, tmp_path):
    mission = f"sleep then report {os.urandom(4).hex()}"
    scripts(tmp_path, sleeper=[{"sh": "sleep 20; echo slept >&4"}, {"exit": "success"}])  # long enough for a loaded machine
    run = subprocess.Popen([QUINEBOX, "run", "-q", "-m", f"script:{tmp_path / 'sleeper.yaml'}", mission], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    context, recorded = browser.context()
    try:
        session = wait_for(lambda: started(mission), 60, what="the run's session in the index")
        listing = open_page(context, view.page_url("#/"), "sessions")
        page = open_page(context, view.page_url(f"#/s/{session}"), "session")
        for p in (listing, page):
            p.evaluate("() => { window.__stillHere = 'marker' }")
        page.wait_for_selector(f'#tree .node[data-session="{session}"][data-state="running"]', timeout=20_000)
        listing.wait_for_selector(f'tr.session[data-session="{session}"][data-state="running"]', timeout=20_000)
        assert run.poll() is None, "the run ended before the page saw it running"
        page.wait_for_selector(f'#tree .node[data-session="{session}"][data-state="done"]', timeout=60_000)
        page.wait_for_selector(f'#transcript[data-session="{session}"] .entry[data-kind="outcome"]')
        listing.wait_for_selector(f'tr.session[data-session="{session}"][data-state="done"]')
        out, err = run.communicate(timeout=60)
        assert (run.returncode, out) == (0, b"slept\n"), err
        for p in (listing, page):
            assert p.loads == 1 and p.evaluate("() => window.__stillHere") == "marker"
        no_foreign(recorded, view.origin)
    finally:
        context.close()
        stop(run)


def started(mission: str, owned: bool = False):
    """The session of the newest run of `mission` in the index (None until there is one); `owned`: with the
    `host:pid:start` of the process running it, once it has one."""
    index = Index()
    try:
        row = next((row for row in index.recent(20) if row.mission == mission), None)
        if row is None or not owned:
            return row and row.id
        owner = index.owners([row.id]).get(row.id)
        return owner and (row.id, owner)
    finally:
        index.close()


def stop(run: subprocess.Popen) -> None:
    """A run still going when its test failed: SIGTERM, so that quinebox removes its boxes before it exits."""
    if run.poll() is None:
        run.terminate()
        try:
            run.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            run.kill()
            run.communicate(timeout=30)


# -- (d) approvals -----------------------------------------------------------------------------------


def next_request(within: float = 90.0) -> dict:
    def listed():
        return [json.loads(line) for line in qb("approvals", "--json").stdout.splitlines()]

    return wait_for(lambda: (listed() or [None])[0], within, what="a waiting request")


def test_a_waiting_approval_shows_and_only_an_allowed_view_approves_it(browser, tree, tmp_path):
    scripts(
        tmp_path,
        parent=[{"sh": "quinebox run -q -m script:child.yaml 'say hello' >&4; echo child $? >&4"}, {"exit": "success"}],
        child=[{"sh": "echo from the child >&4"}, {"exit": "success"}],
    )
    tmp_path.chmod(0o755)
    run = subprocess.Popen(
        [QUINEBOX, "run", "-q", "-m", f"script:{tmp_path / 'parent.yaml'}", "--ask", "spawn:1", "--ask-timeout", "300", "delegate, if allowed"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        request = next_request()
        rid, session = request["id"], request["session"]
        pending = f'.pending[data-request="{rid}"]'

        with view_server() as view:  # read-only: shows the request, offers no button, refuses a decision
            context, recorded = browser.context()
            try:
                page = open_page(context, view.page_url("#/audit"), "audit")
                page.wait_for_selector(f"#approvals {pending}")
                assert page.locator(f"#approvals {pending} button.approve").count() == 0
                go(page, f"#/s/{session}", "session")
                page.wait_for_selector(f"#approvals-here {pending}")
                assert page.locator(f"#approvals-here {pending} button.approve").count() == 0
                no_foreign(recorded, view.origin)
            finally:
                context.close()
            assert view.json("/api/approvals")["allow_approve"] is False
            status, body, _ = view.request("POST", f"/api/approvals/{rid}", headers={"X-Quinebox-Token": view.token, "Content-Type": "application/json"},
                                           body=json.dumps({"allow": True, "scope": "once"}).encode())
            assert status == 403, body
        assert [r["id"] for r in (json.loads(line) for line in qb("approvals", "--json").stdout.splitlines())] == [rid]
        assert run.poll() is None

        with view_server("--allow-approve") as view:
            # The token alone is not enough for a decision: the page's own header (X-Quinebox-Token) must come with it.
            status, _, _ = view.request("POST", f"/api/approvals/{rid}", headers={"Content-Type": "application/json"},
                                        body=json.dumps({"allow": True, "scope": "once"}).encode())
            assert status == 403
            status, _, _ = view.request("POST", f"/api/approvals/{rid}", token=None, headers={"Content-Type": "application/json", "Cookie": f"{view.cookie}={view.token}"},
                                        body=json.dumps({"allow": True, "scope": "once"}).encode())
            assert status == 403
            context, recorded = browser.context()
            try:
                audit = open_page(context, view.page_url("#/audit"), "audit")
                audit.wait_for_selector(f"#approvals {pending} button.approve")
                assert audit.locator(f"#approvals {pending} button.deny").count() == 1
                page = open_page(context, view.page_url(f"#/s/{session}"), "session")
                page.click(f"#approvals-here {pending} button.approve")
                out, err = run.communicate(timeout=120)
                assert (run.returncode, out) == (0, b"from the child\nchild 0\n"), err
                page.wait_for_selector(f"#approvals-here {pending}", state="detached")  # gone without a reload
                audit.wait_for_selector(f"#approvals {pending}", state="detached")
                assert page.loads == 1 and audit.loads == 1
                no_foreign(recorded, view.origin)
            finally:
                context.close()
        decided = [r for r in AuditLog(state_dir() / "audit").records() if r["kind"] == "approval_decided" and r["facts"].get("id") == rid]
        assert len(decided) == 1 and decided[0]["facts"]["allowed"] is True and decided[0]["session"] == session
        assert "view" in decided[0]["facts"]["by"], decided[0]
    finally:
        stop(run)


# -- (e) the token -----------------------------------------------------------------------------------


def test_without_its_token_the_server_answers_403(view, tree):
    paths = ["/", "/api/sessions", f"/api/sessions/{tree['root']}/tree", "/api/events?topics=sessions", "/static/app.js", "/api/audit"]
    wrong = "x" + view.token[1:] if not view.token.startswith("x") else "y" + view.token[1:]
    for path in paths:
        for token, extra in ((None, {}), (wrong, {}), (None, {"Cookie": f"{view.cookie}={wrong}"})):
            status, body, _ = view.get(path, token=token, headers=extra)
            assert status == 403, (path, token, status)
            assert body.startswith(b"403: this view needs its token"), body[:200]
        joiner = "&" if "?" in path else "?"
        status, _, _ = view.get(f"{path}{joiner}token={wrong}", token=None)
        assert status == 403, path
    status, body, headers = view.get(f"/?token={view.token}", token=None)
    assert status == 200 and b"<html" in body.lower()
    cookie = headers.get("set-cookie") or headers.get("Set-Cookie") or ""
    assert f"{view.cookie}={view.token}" in cookie and "httponly" in cookie.lower(), cookie
    for path in ("/api/sessions", "/static/app.js", f"/api/sessions/{tree['root']}/tree"):
        assert view.get(path, token=None, headers={"Cookie": f"{view.cookie}={view.token}"})[0] == 200, path
        assert view.get(path)[0] == 200, path
    assert b"event-stream" in view.events("sessions", 1.0).split(b"\r\n\r\n")[0].lower()


# -- (f) the network log, over every view ---------------------------------------------------------------


def test_the_page_asks_nothing_of_any_host_but_the_server(browser, view, tree, mapped):
    context, recorded = browser.context()
    try:
        page = open_page(context, view.page_url("#/"), "sessions")
        page.wait_for_selector(f'tr.session[data-session="{tree["root"]}"]')
        page.click(f'tr.session[data-session="{tree["root"]}"]')
        page.wait_for_selector('body[data-route="session"][data-ready="1"]')
        page.wait_for_selector("#tree .node")
        go(page, "#/runs", "runs")
        page.wait_for_selector("table#runs tbody tr.run")
        run_id = page.eval_on_selector("table#runs tbody tr.run", "e => e.dataset.run")
        assert view.json(f"/api/runs/{run_id}")["run"]["out"] == str(mapped["out"])
        go(page, f"#/r/{run_id}", "run")
        page.wait_for_selector(f'#run[data-run="{run_id}"]')
        page.wait_for_function("() => /3\\/3 done, 0 failed, 0 running/.test(document.querySelector('#run-progress').textContent)")
        states = page.eval_on_selector_all("table#run-inputs tbody tr.input", "els => Object.fromEntries(els.map(e => [e.dataset.name, e.dataset.state]))")
        assert states == {name: "done" for name in mapped["names"]}
        go(page, "#/audit", "audit")
        page.wait_for_selector('#audit-verify[data-intact="1"]')
        assert page.loads == 1
        paths = {url[len(view.origin):].split("?")[0] for url in recorded.requests}
        assert "/" in paths and any(p.startswith("/static/") for p in paths) and any(p.startswith("/api/") for p in paths), paths
        no_foreign(recorded, view.origin)
    finally:
        context.close()


# -- (g) time revised: a box paused and resumed, an agent whose host died -------------------------------------


def test_a_paused_box_and_its_moments_show_on_its_page_without_a_reload(browser, view):
    made = qb("box", "create", "--backend", "oci", "--runtime", "runc", timeout=60)
    assert made.returncode == 0, made.stderr
    session = made.stdout.decode().strip()
    context, recorded = browser.context()
    try:
        page = open_page(context, view.page_url(f"#/s/{session}"), "session")
        node = f'#tree .node[data-session="{session}"]'
        page.wait_for_selector(f'{node}[data-state="running"]', timeout=20_000)
        assert qb("box", "pause", session).returncode == 0
        page.wait_for_selector(f'{node}[data-state="paused"]', timeout=20_000)
        page.wait_for_selector('#node-summary .moments li[data-what="paused"]')
        assert qb("box", "resume", session).returncode == 0
        page.wait_for_selector(f'{node}[data-state="running"]', timeout=20_000)
        resumed = page.text_content('#node-summary .moments li[data-what="resumed"]')
        assert resumed is not None and re.search(r" resumed after \d+\.\d\d s paused$", resumed), resumed
        assert page.loads == 1
        no_foreign(recorded, view.origin)
    finally:
        context.close()
        qb("box", "rm", session)


def test_an_agent_whose_host_died_shows_as_interrupted_with_how_to_resume_it(browser, view, tmp_path):
    mission = f"interrupted {os.urandom(4).hex()}"
    scripts(tmp_path, sleeper=[{"sh": "sleep 120"}, {"exit": "success"}])
    run = subprocess.Popen([QUINEBOX, "run", "-q", "-m", f"script:{tmp_path / 'sleeper.yaml'}", mission], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    context, recorded = browser.context()
    try:
        session, owner = wait_for(lambda: started(mission, owned=True), 60, what="the run's session in the index, with its owner")
        page = open_page(context, view.page_url(f"#/s/{session}"), "session")
        node = f'#tree .node[data-session="{session}"]'
        page.wait_for_selector(f'{node}[data-state="running"]', timeout=20_000)
        os.kill(int(owner.split(":")[1]), signal.SIGKILL)  # the process running the session: the run's own, or a command server's worker
        run.communicate(timeout=60)
        page.reload()  # the index does not change when a host dies: a page looks again when it loads
        page.wait_for_selector(f'{node}[data-state="interrupted"]', timeout=20_000)
        assert page.text_content("#node-summary .resume") == f"its process was lost: `quinebox resume {session}` goes on from its last complete turn"
        listing = open_page(context, view.page_url("#/"), "sessions")
        listing.wait_for_selector(f'tr.session[data-session="{session}"][data-state="interrupted"]', timeout=20_000)
        no_foreign(recorded, view.origin)
    finally:
        context.close()
        stop(run)
        qb("gc")


# -- (h) an export, opened from file:// --------------------------------------------------------------------


def test_an_export_opened_from_a_file_shows_the_tree(browser, tree, tmp_path):
    made = qb("view", "--export", str(tmp_path / "export"), tree["root"], timeout=300)
    assert made.returncode == 0, made.stderr
    index = tmp_path / "export" / "index.html"
    assert index.is_file()
    context, recorded = browser.context()
    try:
        page = open_page(context, f"{index.as_uri()}#/s/{tree['root']}", "session")
        page.wait_for_function("() => document.querySelectorAll('#tree .node').length >= 36")
        assert nodes(page) == tree["parents"]
        leaf = next(id for id, row in tree["rows"].items() if row.mission == "Survey district a")
        page.click(f'#tree .node[data-session="{leaf}"] .label')
        page.wait_for_selector(f'#transcript[data-session="{leaf}"] .entry[data-kind="outcome"]')
        no_foreign(recorded, (tmp_path / "export").as_uri())
    finally:
        context.close()
