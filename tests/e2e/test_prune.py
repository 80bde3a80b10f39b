"""`quinebox prune` as a user runs it, on sessions agents left in boxes: what goes, what `ls`, `show` and
`audit verify` say after, and bad rules refused in one line with nothing pruned. A state dir of its own, so
the suite's sessions are never the ones pruned."""

import json
import os
import subprocess
import time

import pytest
from commands import QUINEBOX, scripts


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state")}


def qb(env, *args, input=b""):
    return subprocess.run([QUINEBOX, *args], input=input, capture_output=True, env=env, timeout=180)


def run(env, model, mission):
    done = qb(env, "run", "-q", "-m", f"script:{model}", "--json", mission)
    return done.returncode, json.loads(done.stderr.decode().splitlines()[-1])["session"]


def sessions(env):
    listed = qb({**env, "COLUMNS": "400"}, "ls", "-n", "100").stdout.decode().splitlines()[1:]  # wide: no id folded
    return {line.split()[0] for line in listed}


def test_prune_takes_finished_sessions_and_says_so_and_the_audit_log_still_verifies(tmp_path, env):
    models = scripts(
        tmp_path,
        ok=[{"sh": "echo kept > /world/note; echo done >&4"}, {"exit": "success"}],
        bad=[{"sh": "echo lost > /world/scratch"}, {"exit": {"status": "failure", "reason": "on purpose"}}],
    )
    status_ok, ok = run(env, models / "ok.yaml", "write a note")
    status_bad, bad = run(env, models / "bad.yaml", "fail")
    assert (status_ok, status_bad) == (0, 1) and sessions(env) == {ok, bad}
    state = tmp_path / "state"

    dry = qb(env, "prune", "--failed", "--dry-run")
    listed = [line.split("\t") for line in dry.stdout.decode().splitlines()]
    assert dry.returncode == 0 and [(fields[0], fields[2], fields[4]) for fields in listed] == [(bad, "1", "fail")]
    assert dry.stderr.decode().startswith("quinebox: would prune 1 session(s), ") and (state / "sessions" / bad).exists()

    done = qb(env, "prune", "--failed")
    assert done.returncode == 0 and done.stdout == b""
    assert done.stderr.decode().startswith("quinebox: pruned 1 session(s), ") and done.stderr.count(b"\n") == 1
    assert sessions(env) == {ok} and not (state / "sessions" / bad).exists()
    shown = qb(env, "show", bad)
    assert shown.returncode == 125 and shown.stderr.count(b"\n") == 1
    assert shown.stderr.startswith(f"quinebox: session {bad} was pruned at ".encode()) and b"its tape and world are gone" in shown.stderr
    assert qb(env, "show", ok).returncode == 0
    assert qb(env, "audit", "verify").returncode == 0
    kinds = [json.loads(line)["kind"] for line in (state / "audit" / "log.jsonl").read_text().splitlines()]
    assert "prune" in kinds
    listed = qb(env, "audit", "--session", bad).stdout.decode().splitlines()
    assert listed and all(f"{bad} (pruned)" in line for line in listed)  # its records stay, marked
    assert all("(pruned)" not in line for line in qb(env, "audit", "--session", ok).stdout.decode().splitlines())


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "quinebox: say which sessions to prune: --older-than DURATION, --keep N, --failed or --succeeded (--dry-run lists them first)\n"),
        (["--failed", "--succeeded"], "quinebox: --failed and --succeeded together match nothing: give one of them\n"),
        (["--older-than", "soon"], "quinebox: --older-than: bad duration 'soon': use seconds or a unit ms, s, m, h or d (e.g. 30, 30s, 5m, 7d)\n"),
        (["--keep", "-1"], "quinebox: --keep -1: give how many of the newest sessions to keep, 0 or more\n"),
    ],
)
def test_bad_rules_are_one_line_exit_2_and_nothing_is_pruned(tmp_path, env, args, message):
    models = scripts(tmp_path, ok=[{"exit": "success"}])
    _, ok = run(env, models / "ok.yaml", "nothing much")
    done = qb(env, "prune", *args)
    assert (done.returncode, done.stdout, done.stderr.decode()) == (2, b"", message)
    assert sessions(env) == {ok}


def test_gc_lets_go_of_an_unpacked_image_no_box_has_used_for_the_retention_time(tmp_path, env):
    assert qb(env, "exec", "--backend", "oci", "--", "true").returncode == 0  # unpacks the image into this state dir, marking its use
    [image] = [p for p in (tmp_path / "state" / "images").iterdir() if len(p.name) == 64]
    assert (image / "used").exists()
    config = tmp_path / "config" / "quinebox"
    config.mkdir(parents=True)
    (config / "config.yaml").write_text("retention: {images: 1d}\n")
    env = {**env, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    kept = qb(env, "gc")
    assert kept.returncode == 0 and image.is_dir()  # used a moment ago
    old = time.time() - 2 * 86400
    os.utime(image / "used", (old, old))
    done = qb(env, "gc")
    assert done.returncode == 0 and not image.exists()
    assert f"removed unpacked image {image.name[:12]}: no box has used it for 1d (retention: images in config.yaml)".encode() in done.stderr
    again = qb(env, "exec", "--backend", "oci", "--", "echo", "afresh")
    assert (again.returncode, again.stdout) == (0, b"afresh\n") and (image / "used").exists()
