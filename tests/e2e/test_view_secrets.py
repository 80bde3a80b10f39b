"""No secret's value and no provider key on any page of `quinebox view`, its event stream, its API or an export, in a
real browser over a real run whose tape does hold both (an HTTPS service on loopback sends them back into the box)."""

from __future__ import annotations

import http.server
import json
import os
import ssl
import threading
from urllib.parse import quote

from certificates import issue_certificates
from commands import qb, scripts
from host_address import host_address
from view_browser import export_files, go, no_foreign, open_page, view_server

from quinebox.agent.store import read_tape


class Echo(http.server.BaseHTTPRequestHandler):
    """An HTTPS service that says back the credential it was sent, and the provider's key besides: what reaches the
    box from a careless service reaches its tape, so only the view's own scrubbing keeps it off the page."""

    key = ""

    def do_GET(self):
        body = f"you sent [{self.headers.get('Authorization', '')}] and the key is [{self.key}]\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


FETCH = (
    "python3 -c \"import os, urllib.request; r = urllib.request.Request('https://api.test:{port}/', "
    "headers={{'Authorization': 'Bearer ' + os.environ['ACME_CODE']}}); print(urllib.request.urlopen(r, timeout=30).read().decode(), end='')\""
    " > /world/reply; cat /world/reply; cat /world/reply >&4"
)


def test_no_secret_or_provider_key_on_any_page_stream_or_export(browser, tmp_path):
    secret, key = "acme-" + os.urandom(16).hex(), "sk-live-" + os.urandom(16).hex()
    cert, private = issue_certificates(tmp_path, "api.test")
    (tmp_path / "cert.pem").write_text(cert)
    (tmp_path / "key.pem").write_text(private)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    Echo.key = key
    address = host_address()  # not loopback: a box reaches that only as host-loopback, and the secret's host is api.test
    server = http.server.ThreadingHTTPServer((address, 0), Echo)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    (tmp_path / "hosts").write_text(f"{address} api.test\n")
    env = {**os.environ, "ACME_CODE": secret, "OPENAI_API_KEY": key, "QUINEBOX_EGRESS_HOSTS": str(tmp_path / "hosts"), "SSL_CERT_FILE": str(tmp_path / "ca.pem")}
    scripts(tmp_path, fetch=[{"say": "fetching the greeting", "sh": FETCH.format(port=port)}, {"exit": "success"}])
    mission = f"fetch the greeting {os.urandom(3).hex()}"
    try:
        with view_server(env=env) as view:
            context, recorded = browser.context()
            try:
                listing = open_page(context, view.page_url("#/"), "sessions")
                streamed: list[bytes] = []
                follower = threading.Thread(target=lambda: streamed.append(view.events("sessions,runs,audit,approvals", 25.0)))
                follower.start()
                done = qb("run", "-q", "--json", "-m", f"script:{tmp_path / 'fetch.yaml'}", "-g", f"net:{address}:{port}", "-g", "secret:ACME_CODE@api.test",
                          mission, env=env, timeout=300)
                assert done.returncode == 0, done.stderr[-2000:]
                session = json.loads(done.stderr.decode().splitlines()[-1])["session"]
                # Not a vacuous check: the real value did come back into the box's record.
                assert f"[Bearer {secret}]".encode() in done.stdout and key.encode() in done.stdout
                assert secret in json.dumps(read_tape(session))
                listing.wait_for_selector(f'tr.session[data-session="{session}"][data-state="done"]')
                follower.join(timeout=60)

                seen: dict[str, str] = {"stream": streamed[0].decode(errors="replace") if streamed else ""}
                page = open_page(context, view.page_url(f"#/s/{session}"), "session")
                page.wait_for_selector(f'#transcript[data-session="{session}"] .entry[data-kind="outcome"]')
                assert "[redacted]" in page.inner_text("#transcript") or "you sent" in page.inner_text("#transcript")
                if page.locator("#world-tab").count():  # the world is a tab beside the transcript
                    page.click("#world-tab")
                page.wait_for_selector("#world .rev")
                revs = page.eval_on_selector_all("#world .rev", "els => els.map(e => e.dataset.rev)")
                assert len(revs) >= 2, revs  # the start, and the sh call that wrote /world/reply
                for rev in revs:
                    with page.expect_response(lambda r: f"/world/{rev}/diff" in r.url):
                        page.click(f'#world .rev[data-rev="{rev}"]')
                    page.wait_for_selector(f'#world-diff[data-rev="{rev}"]', state="attached")  # the answer, rendered
                    seen[f"world diff {rev}"] = page.inner_text("#world")
                assert "[redacted]" in seen[f"world diff {revs[-1]}"], seen[f"world diff {revs[-1]}"]
                seen["session page"] = page.content() + page.inner_text("body")
                for route, name in (("#/", "sessions"), ("#/runs", "runs"), ("#/audit", "audit")):
                    go(page, route, name)
                    page.wait_for_timeout(300)
                    seen[f"page {route}"] = page.content() + page.inner_text("body")
                for response in recorded.responses:
                    if "/api/events" not in response.url:
                        try:
                            seen[f"response {response.url}"] = response.text()
                        except Exception:  # noqa: BLE001 - a body the browser no longer holds: fetched again below
                            pass
                no_foreign(recorded, view.origin)
            finally:
                context.close()
            api = [f"/api/sessions?q={quote(mission)}", f"/api/sessions/{session}", f"/api/sessions/{session}/tree", f"/api/sessions/{session}/transcript",
                   f"/api/sessions/{session}/world", "/api/runs", "/api/audit?limit=1000", "/api/approvals"]
            for rev in view.json(f"/api/sessions/{session}/world")["revisions"]:
                api += [f"/api/sessions/{session}/world/{rev['rev']}/diff", f"/api/sessions/{session}/world/{rev['rev']}/files"]
                for file in view.json(f"/api/sessions/{session}/world/{rev['rev']}/files")["files"]:
                    api.append(f"/api/sessions/{session}/world/{rev['rev']}/file?path={quote(file['path'])}")
            assert any(p.endswith("/file?path=reply") for p in api), api
            for path in api:
                status, body, _ = view.get(path)
                assert status == 200, path
                seen[path] = body.decode(errors="replace")
            assert "[redacted]" in seen[f"/api/sessions/{session}/transcript"]
        exported = tmp_path / "export"
        made = qb("view", "--export", str(exported), env=env, timeout=300)
        assert made.returncode == 0, made.stderr
        made_one = qb("view", "--export", str(tmp_path / "export-one"), session, env=env, timeout=300)
        assert made_one.returncode == 0, made_one.stderr
        files = {**export_files(exported), **{f"one/{k}": v for k, v in export_files(tmp_path / "export-one").items()}}
        assert "data.js" in files and "index.html" in files
        for name, data in files.items():
            seen[f"export {name}"] = data.decode(errors="replace")
        leaks = [where for where, text in seen.items() if secret in text or key in text]
        assert leaks == [], f"the secret or the key shows in: {leaks}"
        assert secret[:12] not in "".join(seen.values()) and key[8:20] not in "".join(seen.values())  # not even a prefix of either
    finally:
        server.shutdown()
        server.server_close()
