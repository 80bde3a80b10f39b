"""A real session run under a umask of 000 (as a shared machine's careless login may set it): every dir and file it
leaves in the state dir is its user's alone — the tape and the index, its world and its child's, their revisions
and the objects, the audit log — while the world stays the box's to write (owned by the box's uid)."""

import json
import os
import stat
import subprocess
from pathlib import Path

from commands import QUINEBOX, scripts

from quinebox.state import state_dir

TREE = ["-g", "spawn:4", "-g", "depth:1"]


def wrong_modes(root: Path, *, besides: tuple[Path, ...] = ()) -> dict[str, str]:
    """`root` and each entry under it (not below `besides`: a world's own files) whose mode is not the one it must
    have — dirs 0700, files 0600, objects and sealed audit segments 0400 — as path → what it is."""
    wrong = {}
    paths = [root] + [Path(top) / name for top, dirs, files in os.walk(root) for name in dirs + files]
    for path in paths:
        if any(inner in path.parents for inner in besides):
            continue
        info = os.lstat(path)
        sealed = (path.parent.parent.name == "objects" and len(path.parent.name) == 2) or path.parent.name == "segments"
        want = 0o700 if stat.S_ISDIR(info.st_mode) else 0o400 if sealed else 0o600
        if stat.S_IMODE(info.st_mode) != want:
            wrong[str(path)] = f"{stat.filemode(info.st_mode)}, not {want:04o}"
    return wrong


def test_a_sessions_tape_worlds_objects_and_audit_are_the_users_alone_under_umask_000(tmp_path):
    child = "quinebox exec -- sh -c 'echo from the child > /world/child.txt; cat /world/notes.txt'"
    scripts(tmp_path, mission=[{"sh": "echo the secret notes > notes.txt"}, {"sh": f"{child} >&4"}, {"exit": "success"}])
    done = subprocess.run(
        [QUINEBOX, "run", "-q", "--json", "-m", f"script:{tmp_path / 'mission.yaml'}", *TREE, "the secret mission"],
        capture_output=True, timeout=120, preexec_fn=lambda: os.umask(0),
    )
    assert (done.returncode, done.stdout) == (0, b"the secret notes\n"), done.stderr
    session = json.loads(done.stderr.decode().splitlines()[-1])["session"]
    home = state_dir()
    tape = [json.loads(line) for line in (home / "sessions" / session / "tape.jsonl").read_bytes().splitlines()]
    (spawned,) = [r["child"] for r in tape if r["kind"] == "spawn"]
    worlds = []
    for which, layers in ((session, ("tree",)), (spawned, ("upper", "work"))):
        world = home / "sessions" / which / "world"
        meta = json.loads((world / "meta.json").read_bytes())
        owner = (meta["uid"], meta["gid"]) if os.geteuid() == 0 else (os.getuid(), os.getgid())  # root hands it to the box's user
        for layer in layers:  # the box's to write, and no one else's
            info = os.stat(world / layer)
            assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o700, *owner), (which, layer)
            worlds.append(world / layer)
    assert (home / "sessions" / spawned / "world" / "upper" / "child.txt").exists()
    assert len(list((home / "audit").glob("*"))) >= 2 and list((home / "objects").glob("??/*"))
    wrong = {}
    for root in (home / "sessions" / session, home / "sessions" / spawned, home / "objects", home / "audit"):
        wrong.update(wrong_modes(root, besides=tuple(worlds)))
    for name in ("sessions", "sessions.db", "sessions.db-wal", "sessions.db-shm", "sessions.db.lock"):
        if (home / name).exists():
            info = os.lstat(home / name)
            want = 0o700 if stat.S_ISDIR(info.st_mode) else 0o600
            if stat.S_IMODE(info.st_mode) != want:
                wrong[name] = f"{stat.filemode(info.st_mode)}, not {want:04o}"
    assert wrong == {}
