"""`quinebox view --export DIR`: the same page as a static bundle, for a CI job's artifacts.

The page asks the same API paths either way; in a bundle it finds their answers in `data.js`
(window.QUINEBOX_DATA, keyed by path), so it opens from file:// with no server and nothing fetched.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from quinebox.errors import QuineboxError
from quinebox.view.catalog import Catalog

STATIC = Path(__file__).parent / "static"
#: Sessions a bundle of everything holds at most (the newest).
MAX_SESSIONS = 500
MARK = "<!-- export: data.js -->"


def export(out: str, session: str | None = None, catalog: Catalog | None = None) -> dict[str, int]:
    """Write the bundle; how many sessions, runs and answers it holds."""
    catalog = catalog or Catalog()
    catalog.learn_secrets()
    data: dict[str, Any] = {}

    def put(path: str, read: Callable[[], Any]) -> Any:
        try:
            data[path] = read()
        except (KeyError, QuineboxError, OSError, ValueError):
            return None
        return data[path]

    if session is not None:
        root = catalog.sessions.find(session).id
        tree = put(f"/api/sessions/{root}/tree", lambda: catalog.sessions.tree(root))
        ids = [node["id"] for node in tree["nodes"] if node["kind"] == "agent"]
        data["/api/sessions"] = {"sessions": [catalog.sessions.one(i)["session"] for i in ids]}
    else:
        rows = put("/api/sessions", lambda: {"sessions": catalog.sessions.list(limit=MAX_SESSIONS)})["sessions"]
        ids = [row["id"] for row in rows]
        for row in rows:
            if row["parent"] is None:
                put(f"/api/sessions/{row['id']}/tree", partial(catalog.sessions.tree, row["id"]))
    for sid in ids:
        put(f"/api/sessions/{sid}", partial(catalog.sessions.one, sid))
        if f"/api/sessions/{sid}/tree" not in data:
            put(f"/api/sessions/{sid}/tree", partial(catalog.sessions.tree, sid))
        put(f"/api/sessions/{sid}/transcript", partial(catalog.sessions.transcript, sid))
        world = put(f"/api/sessions/{sid}/world", partial(catalog.world_revisions, sid)) or {"revisions": []}
        for revision in world["revisions"]:
            put(f"/api/sessions/{sid}/world/{revision['rev']}/diff", partial(catalog.world_diff, sid, revision["rev"]))
    runs = put("/api/runs", lambda: {"runs": catalog.runs()}) or {"runs": []}
    for run in runs["runs"]:
        put(f"/api/runs/{run['id']}", partial(lambda run_id: {"run": catalog.run(run_id)}, run["id"]))
    put("/api/audit", lambda: catalog.audit.page(2000))
    data["/api/approvals"] = {"pending": catalog.pending(), "allow_approve": False}

    target = Path(out)
    (target / "static").mkdir(parents=True, exist_ok=True)
    for asset in STATIC.iterdir():
        if asset.is_file() and asset.name != "index.html":
            shutil.copyfile(asset, target / "static" / asset.name)
    page = (STATIC / "index.html").read_text()
    (target / "index.html").write_text(page.replace(MARK, '<script src="data.js"></script>'))
    (target / "data.js").write_text(f"window.QUINEBOX_DATA = {catalog.redactor.json(data)};\n")
    return {"sessions": len(ids), "runs": len(runs["runs"]), "answers": len(data)}
