"""The command server's pool of warm boxes on an OCI runtime (runc, and gVisor's runsc): the same box as a cold start,
its command given the claimer's own stdin, stdout and stderr, its end told by the keeper, and nothing left behind.

Each test starts its own server (in a state dir of its own) with a small pool.
"""

import io
import json
import os
import re
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from commands import QUINEBOX

import quinebox
from quinebox.box.backends.oci import idmap
from quinebox.box.policy import HOST_SOCKET, LABEL_SESSION
from quinebox.box.shape import LABEL_POOL, POOL_COMMAND

PROBE = "env | sort; id; pwd; grep -E '^(Uid|Gid|Groups|Cap|NoNewPrivs|Seccomp)' /proc/self/status; ulimit -a; mount | grep -E ' /(world|tmp) '"


@pytest.fixture(autouse=True)
def oci_backend(monkeypatch):
    monkeypatch.setenv("QUINEBOX_BACKEND", "oci")


def quinebox_cli(*args, env, **options):
    return subprocess.run([QUINEBOX, *args], env=env, capture_output=True, timeout=120, **options)


def status(env) -> dict:
    said = quinebox_cli("serve", "status", "--json", env=env)
    assert said.returncode == 0, said.stderr
    return json.loads(said.stdout)


def shapes(env) -> list[dict]:
    return (status(env).get("pool") or {}).get("shapes", [])


def warm_count(env) -> int:
    return sum(shape["warm"] for shape in shapes(env))


def hits(env) -> int:
    return sum(shape["hits"] for shape in shapes(env))


def refilled(env) -> None:
    """The default shape's two warm boxes there again: commands in a row claim one each only when none comes before
    its refill (the native thin client's are quicker than the keeper's `runc run` under load)."""
    wait_for(lambda: warm_count(env) == 2, "the pool refilled")


def wait_for(condition, what: str, timeout: float = 60.0) -> None:
    until = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < until, f"timed out waiting for {what}"
        time.sleep(0.1)


def containers(env, runtime: str = "runc") -> list[dict]:
    """What the runtime holds in the state dir's root: every box, warm, claimed or cold, and any left behind."""
    root = Path(env["QUINEBOX_STATE_DIR"], "oci", runtime)
    if not root.is_dir():
        return []
    for _ in range(5):  # runc 1.1's list fails outright when a box it found goes before it reads its state: once more
        listed = subprocess.run([runtime, "--root", str(root), "list", "--format", "json"], capture_output=True, timeout=30)
        if listed.returncode == 0 or not (b"container does not exist" in listed.stderr or b"no such file or directory" in listed.stderr):
            break  # its state directory gone under it (`stat …: no such file or directory`) is that race too
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout or b"null") or []


def cgroups(names: set[str]) -> list[str]:
    """Which of the boxes named `names` still have a cgroup in the pids hierarchy (v1's here; v2's root elsewhere):
    a box's cgroup is named as its container is."""
    root = Path("/sys/fs/cgroup/pids") if Path("/sys/fs/cgroup/pids").is_dir() else Path("/sys/fs/cgroup")
    return [str(p) for p in root.rglob("quinebox-pool-*") if p.name in names]


def bundle_config(env, container: str) -> dict:
    return json.loads(Path(env["QUINEBOX_STATE_DIR"], "run", container.removeprefix("quinebox-") + ".oci", "config.json").read_text())


def own_parts(config: dict, box) -> str:
    """A box's config.json less whose it is (its annotations but its user's), its own ids and paths named by what
    they are: what it runs and with what environment stay (a claimed box's bundle says its claimer's process)."""
    config = json.loads(json.dumps(config))
    config["annotations"] = {key: value for key, value in config["annotations"].items() if key.endswith(".user")}
    for mount in config["mounts"]:
        if mount["destination"] in ("/world", HOST_SOCKET):
            mount["source"] = "<own>"
    for key in ("uidMappings", "gidMappings"):  # a root-made box's own host ids (backends/oci/idmap.py), and its root in their slot
        for mapping in config["linux"].get(key, ()):
            mapping["hostID"] = "<own>"
    config["root"]["path"] = re.sub(r"^/run/quinebox/boxes/[0-9]+/", "/run/quinebox/boxes/<slot>/", config["root"]["path"])
    said = json.dumps(config, sort_keys=True).replace(f"QUINEBOX_SESSION={box.session}", "QUINEBOX_SESSION=<session>")
    said = said.replace(box.id.removeprefix("quinebox-"), "<id>").replace(box.session, "<session>")
    return re.sub(r"\.oci-[0-9a-z_]+/", ".oci-<own>/", said)  # a rootless box's layers, in a directory of its own in /dev/shm


def start_server(tmp_path, size: int = 2, runtime: str = "runc") -> dict:
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.update(QUINEBOX_SERVE="manual", QUINEBOX_BACKEND="oci", QUINEBOX_RUNTIME=runtime)
    env.pop("QUINEBOX_POOL", None)
    started = quinebox_cli("serve", "--background", "--pool", str(size), env=env)
    assert started.returncode == 0, started.stderr
    wait_for(lambda: warm_count(env) == size, "the default shape's warm boxes")
    return env


@pytest.fixture
def pooled(tmp_path):
    """A state dir with a command server keeping 2 warm boxes per shape on runc; the environment that reaches it."""
    env = start_server(tmp_path)
    yield env
    quinebox_cli("serve", "stop", env=env)


@pytest.mark.parametrize("grants", [[], ["mem:300M", "pids:64"]], ids=["default", "limits-of-its-own"])
def test_a_claimed_box_is_configured_and_behaves_exactly_as_a_cold_one(pooled, monkeypatch, grants):
    monkeypatch.setenv("QUINEBOX_STATE_DIR", pooled["QUINEBOX_STATE_DIR"])
    monkeypatch.delenv("QUINEBOX_POOL", raising=False)
    if grants:  # a shape of its own: a miss first, then kept warm
        assert quinebox.exec(["true"], grants=grants).returncode == 0
        wait_for(lambda: warm_count(pooled) == 4, "the new shape's warm boxes")
    before = hits(pooled)
    warm = quinebox.Popen(["sleep", "60"], grants=grants, stdin=quinebox.DEVNULL)
    monkeypatch.setenv("QUINEBOX_POOL", "off")
    cold = quinebox.Popen(["sleep", "60"], grants=grants, stdin=quinebox.DEVNULL)
    try:
        assert warm.claimed is not None and cold.claimed is None and hits(pooled) == before + 1
        claimed, started = bundle_config(pooled, warm.id), bundle_config(pooled, cold.id)
        assert own_parts(claimed, warm) == own_parts(started, cold)
        assert claimed["annotations"][LABEL_SESSION].startswith("pool-") and LABEL_POOL in claimed["annotations"]
        # made to run the init alone, its command and environment coming with its claim (the runtime's own record)
        made = json.loads(subprocess.run(["runc", "--root", f"{pooled['QUINEBOX_STATE_DIR']}/oci/runc", "state", warm.id], capture_output=True, timeout=30).stdout)
        assert made["annotations"][LABEL_SESSION] == claimed["annotations"][LABEL_SESSION]
        shown = quinebox_cli("ps", env=pooled).stdout.decode()
        assert warm.session in shown and "sleep 60" in shown and "pool-" not in shown  # the claimer's, by its record
    finally:
        warm.kill()
        cold.kill()
        assert (warm.wait(), cold.wait()) == (137, 137)
    monkeypatch.delenv("QUINEBOX_POOL")
    wait_for(lambda: warm_count(pooled) == (4 if grants else 2), "the pool to refill")
    probe = PROBE + "; cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max"
    seen_warm = quinebox.exec(["sh", "-c", probe], grants=["env:GIVEN=by-the-caller", *grants])
    monkeypatch.setenv("QUINEBOX_POOL", "off")
    seen_cold = quinebox.exec(["sh", "-c", probe], grants=["env:GIVEN=by-the-caller", *grants])
    assert hits(pooled) == before + 2
    assert seen_warm.returncode == seen_cold.returncode == 0, seen_warm.stderr + seen_cold.stderr
    assert b"GIVEN=by-the-caller" in seen_warm.stdout
    assert same(seen_warm) == same(seen_cold)


def same(seen) -> bytes:
    """What a box saw, less its session and its own host ids (a root-made box's: the tmpfs it mounted as its root)."""
    said = seen.stdout.replace(seen.session.encode(), b"S")
    return re.sub(rb"([ug]id)=([0-9]+)", lambda m: m[1] + b"=<own>" if idmap.holding(int(m[2])) else m[0], said)


def test_a_warm_box_holds_nothing_of_a_command_before_its_claim(pooled):
    warm = [c for c in containers(pooled) if c["status"] == "running"]
    assert len(warm) == 2
    config = bundle_config(pooled, warm[0]["id"])
    assert config["process"]["args"] == list(POOL_COMMAND) and config["process"]["env"] == []
    assert {m["destination"] for m in config["mounts"] if m["type"] == "bind"} == {"/world", "/.quinebox", HOST_SOCKET}
    assert {ns["type"] for ns in config["linux"]["namespaces"]} >= {"network", "pid", "mount"}
    assert config["root"]["readonly"] and config["process"]["noNewPrivileges"]
    assert b"pool-" not in quinebox_cli("ps", env=pooled).stdout  # the pool's, not anyone's command


def test_a_claimed_box_writes_the_callers_own_streams_and_exits_as_a_cold_one(pooled, tmp_path):
    before = hits(pooled)
    refilled(pooled)
    done = quinebox_cli("exec", "--json", "--", "sh", "-c", "cat; echo err >&2; touch /world/made; exit 3", env=pooled, input=b"\x00in\xff")
    assert (done.returncode, done.stdout) == (3, b"\x00in\xff")
    facts = json.loads(done.stderr.decode().splitlines()[-1])
    assert facts["exit_code"] == 3 and done.stderr.startswith(b"err\n")
    exported = quinebox_cli("world", "export", facts["session"], env=pooled)
    assert exported.returncode == 0, exported.stderr
    assert [member.name.lstrip("./") for member in tarfile.open(fileobj=io.BytesIO(exported.stdout))] == ["made"]
    # the box writes the caller's file itself, where the caller left it (no relay in between)
    log = tmp_path / "log"
    refilled(pooled)
    with open(log, "wb") as out:
        out.write(b"head\n")
        out.flush()
        written = subprocess.run([QUINEBOX, "exec", "--", "sh", "-c", "echo from the box; echo to err >&2"], env=pooled, stdout=out, stderr=out, timeout=60)
    assert written.returncode == 0 and log.read_bytes() == b"head\nfrom the box\nto err\n"
    refilled(pooled)
    missing = quinebox_cli("exec", "--", "no-such-command", env=pooled)
    assert missing.returncode == 127 and missing.stderr.count(b"\n") == 1 and b"no-such-command" in missing.stderr
    refilled(pooled)
    timed = quinebox_cli("exec", "--timeout", "1", "--", "sleep", "30", env=pooled)
    assert timed.returncode == 124 and b"time limit" in timed.stderr
    assert hits(pooled) == before + 4


def test_an_agent_and_its_empty_world_child_draw_from_the_pool(pooled, tmp_path):
    (tmp_path / "leaf.yaml").write_text(json.dumps({"turns": [{"sh": "cat <&3 >&4"}, {"exit": "success"}]}))
    child = {"mission": "copy", "material": "to the child\n", "model": "script:leaf.yaml", "world": "empty"}
    (tmp_path / "parent.yaml").write_text(json.dumps({"turns": [{"fork": {"mode": "wait", "children": [child]}}, {"sh": "echo parent done >&4"}, {"exit": "success"}]}))
    before = hits(pooled)
    ran = quinebox_cli("run", "-q", "--json", "-m", f"script:{tmp_path / 'parent.yaml'}", "-g", "spawn:1", "-g", "depth:1", "delegate", env=pooled)
    assert (ran.returncode, ran.stdout) == (0, b"parent done\n"), ran.stderr
    assert hits(pooled) == before + 2  # the agent, and its child
    tree = quinebox_cli("tree", json.loads(ran.stderr.decode().splitlines()[-1])["session"], env=pooled)
    assert tree.returncode == 0 and tree.stdout.count(b"copy") == 1 and b"delegate" in tree.stdout, tree.stdout + tree.stderr


def test_an_oom_kill_in_a_claimed_box_is_told_by_the_keeper(pooled):
    grants = ["-g", "mem:64m"]
    first = quinebox_cli("exec", *grants, "--", "true", env=pooled)  # a miss: the shape is kept warm from now on
    assert first.returncode == 0
    wait_for(lambda: warm_count(pooled) == 4, "the new shape's warm boxes")
    before = hits(pooled)
    done = quinebox_cli("exec", *grants, "--", "python3", "-c", "x = bytearray(256 << 20)", env=pooled)
    assert hits(pooled) == before + 1
    assert done.returncode == 137 and b"out of memory" in done.stderr, done.stderr


def test_a_killed_client_takes_its_claimed_box_within_a_second(pooled):
    before = hits(pooled)
    client = subprocess.Popen([QUINEBOX, "exec", "--", "sleep", "60"], env=pooled)
    wait_for(lambda: hits(pooled) == before + 1, "the claim")
    [record] = wait_for_claim_records(pooled)
    container = record.removesuffix(".json")
    client.kill()
    client.wait()
    began = time.monotonic()
    wait_for(lambda: container not in {c["id"] for c in containers(pooled)}, "the box to go", timeout=10)
    assert time.monotonic() - began < 1.5
    wait_for(lambda: not wait_for_claim_records(pooled, 0), "its claim record to go", timeout=5)


def wait_for_claim_records(env, count: int = 1) -> list[str]:
    directory = Path(env["QUINEBOX_STATE_DIR"], "run", "claimed")
    until = time.monotonic() + 10
    while len(found := os.listdir(directory) if directory.is_dir() else []) != count and time.monotonic() < until:
        time.sleep(0.05)
    return found


@pytest.mark.parametrize("end", ["kill -9", "serve stop"])
def test_a_server_that_ends_leaves_no_box_cgroup_or_process(tmp_path, end):
    """Warm boxes go at once; one mid-make goes as its make ends; a running command ends as its end says (serve stop
    lets it finish; a killed server's worker dies with it, and its client exits 125 with one line)."""
    env = start_server(tmp_path, size=6)
    pool = status(env)["pool"]["pid"]
    client = subprocess.Popen([QUINEBOX, "exec", "--", "sh", "-c", "sleep 2; echo finished"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: hits(env) == 1, "the claim")
    made = {c["id"] for c in containers(env)}
    assert len(made) >= 6 and cgroups(made)  # the claimed one, and the warm ones
    if end == "kill -9":
        os.kill(status(env)["pid"], signal.SIGKILL)
    else:
        assert quinebox_cli("serve", "stop", env=env).returncode == 0
    out, err = client.communicate(timeout=60)
    if end == "kill -9":
        assert client.returncode == 125 and err.count(b"\n") == 1 and b"command server" in err
    else:
        assert (client.returncode, out) == (0, b"finished\n"), err
    wait_for(lambda: not os.path.exists(f"/proc/{pool}"), "the keeper gone", timeout=60)
    time.sleep(1)
    assert containers(env) == [] and cgroups(made) == []
    state = Path(env["QUINEBOX_STATE_DIR"])
    assert os.listdir(state / "pool") == [] and os.listdir(state / "run" / "claimed") == []
    assert quinebox_cli("gc", env=env).returncode == 0  # a killed worker's session socket, a killed server's own
    assert set(os.listdir(state / "run")) <= {"claimed", "sandboxes", "unpacking"}


def test_the_python_api_claims_from_the_users_pool_too(pooled, monkeypatch):
    monkeypatch.setenv("QUINEBOX_STATE_DIR", pooled["QUINEBOX_STATE_DIR"])
    before = hits(pooled)
    done = quinebox.exec(["sh", "-c", "cat; exit 5"], input=b"material")
    assert (done.returncode, done.stdout) == (5, b"material") and hits(pooled) == before + 1


@pytest.mark.root_only  # this runsc cannot make a box for a user who is not root (docs/backends.md)
def test_gvisor_boxes_are_kept_warm_and_claimed_too(tmp_path):
    env = start_server(tmp_path, size=1, runtime="runsc")
    try:
        done = quinebox_cli("exec", "--", "sh", "-c", "cat; uname -r >&2; exit 6", env=env, input=b"through gVisor")
        assert (done.returncode, done.stdout) == (6, b"through gVisor") and hits(env) == 1, done.stderr
        assert done.stderr.strip() != os.uname().release.encode()  # gVisor's kernel's own
        wait_for(lambda: containers(env, "runsc"), "the pool to refill with a gVisor box", timeout=60)
    finally:
        quinebox_cli("serve", "stop", env=env)
    wait_for(lambda: containers(env, "runsc") == [], "gVisor's warm boxes to go", timeout=60)


def test_a_long_lived_box_is_made_cold_its_execs_through_its_init(pooled, monkeypatch):
    """A warm box's init is the pool's keeper's child: a box that lasts until it is removed would keep the keeper
    (and its server) up as long, so a long-lived box on a runtime is made by its owner, server or none."""
    monkeypatch.setenv("QUINEBOX_STATE_DIR", pooled["QUINEBOX_STATE_DIR"])
    before = hits(pooled)
    with quinebox.Sandbox() as box:
        assert box._box.claimed is None and hits(pooled) == before
        parent = box.exec(["sh", "-c", 'tr "\\0" " " </proc/$PPID/cmdline; echo; grep -E ":pids:|^0::" /proc/self/cgroup'])
        assert parent.returncode == 0 and b"/.quinebox/guest/lifeline.py -- " in parent.stdout and b"/quinebox-exec-" in parent.stdout


@pytest.mark.root_only  # the image's id from the engine, whose unpacking's lock the test holds
def test_the_status_answers_while_the_pools_keeper_is_making_its_first_boxes(tmp_path):
    """A new state dir's pool keeper unpacks its image before it answers anything. The server's status waited 5 s for
    the keeper's figures, as long as the client waits for the status, so under load `serve status` said no server
    answered (start_server's wait failed on it). Now the status says the keeper is busy, at once."""
    import fcntl

    from quinebox.box.images.rootfs import id_hex
    from quinebox.box.spec import build_spec

    image = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", build_spec(["true"]).image], capture_output=True, timeout=60, check=True)
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.update(QUINEBOX_SERVE="manual", QUINEBOX_BACKEND="oci", QUINEBOX_RUNTIME="runc")
    locks = tmp_path / "state" / "run" / "unpacking"
    locks.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "state", 0o700)
    os.chmod(locks.parent, 0o700)
    try:
        with open(locks / id_hex(image.stdout.decode().strip()), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # as another unpacking of it: the keeper's waits, for as long as this is held
            started = quinebox_cli("serve", "--background", "--pool", "1", env=env)
            assert started.returncode == 0, started.stderr
            said = status(env)
            assert said["pool"] == {"pid": said["pool"]["pid"], "busy": True}, said
            shown = quinebox_cli("serve", "status", env=env)
            assert shown.returncode == 0 and shown.stdout.splitlines()[-1] == f"pool: pid {said['pool']['pid']}, busy making its first warm boxes (ask again in a moment)".encode()
        wait_for(lambda: warm_count(env) == 1, "the warm box, once the keeper has unpacked its image")
    finally:
        quinebox_cli("serve", "stop", env=env)
