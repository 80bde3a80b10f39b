"""`quinebox prune` as a user runs it, on sessions agents left in boxes: what goes, what `ls`, `show` and
`audit verify` say after, and bad rules refused in one line with nothing pruned; and unpacked images leaving
the cache under `gc`, `prune` and automatic retention alike, never one a running box uses. A state dir of its
own, so the suite's sessions and images are never the ones pruned."""

import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
import time
from datetime import datetime

import pytest
from commands import QUINEBOX, scripts

from quinebox.box.policy import native_machine

DAY = 86400


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


def image_tarball(path, data):
    """A `docker save` tarball of an image of one file, `data`: an unpacked image of its own after `image load`,
    with no engine (the rootless pass has none). Returns its id."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("data")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    diff_id = "sha256:" + hashlib.sha256(layer.getvalue()).hexdigest()
    config = json.dumps({"architecture": native_machine(), "os": "linux", "config": {"Cmd": ["/data"]}, "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    image_id = hashlib.sha256(config).hexdigest()
    manifest = json.dumps([{"Config": f"{image_id}.json", "RepoTags": ["quinebox-test/unused:1"], "Layers": ["layer/layer.tar"]}]).encode()
    with tarfile.open(path, "w") as tar:
        for name, member in ((f"{image_id}.json", config), ("layer/layer.tar", layer.getvalue()), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(member)
            tar.addfile(info, io.BytesIO(member))
    return image_id


def unused_image(tmp_path, env, *, days):
    """An image loaded into the state dir that no box has used for `days` (none has: it counts from its unpack),
    and its bytes: the file, and what the cache keeps beside it."""
    image_id = image_tarball(tmp_path / "unused.tar", b"u" * 5000)
    loaded = qb(env, "image", "load", str(tmp_path / "unused.tar"))
    assert (loaded.returncode, loaded.stdout) == (0, f"quinebox-test/unused:1 sha256:{image_id}\n".encode()), loaded.stderr
    image = tmp_path / "state" / "images" / image_id
    then = time.time() - days * DAY
    os.utime(image, (then, then))
    return image, 5000 + sum((image / name).stat().st_size for name in ("image.json", "seal.json"))


def retained(tmp_path, env, images):
    """`retention: {images: IMAGES}` in a config dir of the test's own; retention as if it ran today, so that no
    command's end starts it (tree/retention.py) and takes the images before the command the test runs."""
    config = tmp_path / "config" / "quinebox"
    config.mkdir(parents=True)
    (config / "config.yaml").write_text(f"retention: {{images: {images}}}\n")
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / "retention.last").touch()
    return {**env, "XDG_CONFIG_HOME": str(tmp_path / "config")}


def kb(size):
    return f"{size / 1e3:.1f} kB"


def test_gc_lets_go_of_an_unpacked_image_no_box_has_used_for_the_retention_time(tmp_path, env):
    env = retained(tmp_path, env, "1d")
    assert qb(env, "exec", "--backend", "oci", "--", "true").returncode == 0  # unpacks the image into this state dir, marking its use
    [image] = [p for p in (tmp_path / "state" / "images").iterdir() if len(p.name) == 64]
    assert (image / "used").exists()
    kept = qb(env, "gc")
    assert kept.returncode == 0 and image.is_dir()  # used a moment ago
    old = time.time() - 2 * 86400
    os.utime(image / "used", (old, old))
    done = qb(env, "gc")
    assert done.returncode == 0 and not image.exists()
    assert f"removed unpacked image {image.name[:12]}: no box has used it for 1d (retention: images in config.yaml)".encode() in done.stderr
    again = qb(env, "exec", "--backend", "oci", "--", "echo", "afresh")
    assert (again.returncode, again.stdout) == (0, b"afresh\n") and (image / "used").exists()


@pytest.mark.parametrize("command", [["gc"], ["prune", "--older-than", "1d"]], ids=["gc", "prune"])
def test_an_image_no_box_used_for_the_retention_time_leaves_the_cache_and_one_a_running_box_uses_stays(tmp_path, env, command):
    env = retained(tmp_path, env, "1d")
    unused, size = unused_image(tmp_path, env, days=2)
    box = subprocess.Popen([QUINEBOX, "exec", "--backend", "oci", "--", "sh", "-c", "echo up; exec sleep 120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert box.stdout.readline() == b"up\n", box.stderr.read1()
        [running] = [p for p in (tmp_path / "state" / "images").iterdir() if len(p.name) == 64 and p != unused]
        long_ago = time.time() - 2 * DAY
        os.utime(running / "used", (long_ago, long_ago))  # its box took it as it started: as if that were long ago
        done = qb(env, *command)
        assert done.returncode == 0 and box.poll() is None
        assert not unused.exists() and (running / "rootfs").is_dir()
        if command == ["gc"]:
            said = f"quinebox: removed unpacked image {unused.name[:12]}: no box has used it for 1d (retention: images in config.yaml); the next box of it unpacks it afresh\n"
            assert done.stderr.decode() == said + "quinebox: removed 0 orphaned boxes\n"
        else:
            said = f"quinebox: pruned 0 session(s), 0.0 kB; 0 world object(s), 0.0 kB; 0 run record(s); 1 unpacked image(s), {kb(size)}\n"
            assert (done.stdout, done.stderr.decode()) == (b"", said)
            [pruned] = [json.loads(line) for line in (tmp_path / "state" / "audit" / "log.jsonl").read_text().splitlines() if json.loads(line)["kind"] == "pruned"]
            facts = pruned["facts"]
            assert (facts["images"], facts["image_bytes"], facts["image_ids"], facts["by"]["uid"]) == (1, size, [f"sha256:{unused.name}"], os.getuid())
    finally:
        box.terminate()
        box.wait(timeout=60)
    again = qb(env, *command)  # its box has ended: only that box kept it
    assert again.returncode == 0 and not running.exists()
    if command == ["gc"]:
        assert again.stderr.decode().startswith(f"quinebox: removed unpacked image {running.name[:12]}: no box has used it for 1d (retention: images in config.yaml)")
    else:
        assert re.fullmatch(rb"quinebox: pruned 0 session\(s\), 0.0 kB; 0 world object\(s\), 0.0 kB; 0 run record\(s\); 1 unpacked image\(s\), \d+\.\d MB\n", again.stderr), again.stderr


def test_prune_dry_run_lists_each_unpacked_image_that_would_go_and_removes_nothing(tmp_path, env):
    env = retained(tmp_path, env, "36h")
    unused, size = unused_image(tmp_path, env, days=2)
    used = datetime.fromtimestamp(unused.stat().st_mtime).strftime("%Y-%m-%d %H:%M:%S")
    dry = qb(env, "prune", "--keep", "5", "--dry-run")
    assert dry.returncode == 0 and unused.is_dir()
    assert dry.stdout.decode() == f"sha256:{unused.name}\t{used}\t-\t{size}\tunpacked image: no box has used it for 36h (retention: images in config.yaml)\n"
    assert dry.stderr.decode() == f"quinebox: would prune 0 session(s), 0.0 kB; 0 world object(s), 0.0 kB; 0 run record(s); 1 unpacked image(s), {kb(size)}\n"
    (tmp_path / "config" / "quinebox" / "config.yaml").write_text("retention: {images: soon}\n")
    refused = qb(env, "prune", "--keep", "5")
    assert (refused.returncode, refused.stderr) == (125, b"quinebox: bad `retention: {images:}` in config.yaml: bad duration 'soon': use seconds or a unit ms, s, m, h or d (e.g. 30, 30s, 5m, 7d)\n")
    assert unused.is_dir()


def test_automatic_retention_lets_go_of_an_unused_image_too(tmp_path, env):
    env = retained(tmp_path, env, "1d")
    unused, size = unused_image(tmp_path, env, days=2)
    (tmp_path / "state" / "retention.last").unlink()  # a day has passed: the next command's end starts retention
    assert qb(env, "ls").returncode == 0
    deadline = time.monotonic() + 60
    while unused.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not unused.exists()
    log = tmp_path / "state" / "retention.log"
    said = f"quinebox: pruned 0 session(s), 0.0 kB; 0 world object(s), 0.0 kB; 0 run record(s); 1 unpacked image(s), {kb(size)}\n".encode()
    while log.read_bytes() != said and time.monotonic() < deadline:
        time.sleep(0.1)
    assert log.read_bytes() == said
