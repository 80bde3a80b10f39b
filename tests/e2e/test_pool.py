"""The command server's pool of warm boxes on the Docker engine: the same box as a cold start, sooner, and gone with its owner.

Each test starts its own server (in a state dir of its own) with a small pool.
"""

import io
import json
import os
import signal
import subprocess
import tarfile
import time

import pytest
from commands import QUINEBOX

import quinebox
from quinebox.box.backends.docker.engine import DockerBackend
from quinebox.box.backends.docker.warm import start_warm
from quinebox.box.policy import HOST_SOCKET, LABEL_OWNER, LABEL_SESSION, LABEL_USER
from quinebox.box.pool.keeper import SETTLE_TIMEOUT, Makers, default_shape
from quinebox.box.shape import LABEL_POOL, POOL_COMMAND
from quinebox.errors import EngineError
from quinebox.processes import process_start_ticks
from quinebox.state import SERVE_SOCKET

pytestmark = pytest.mark.root_only  # boxes on the engine; the pool on an OCI runtime is test_pool_oci.py's


@pytest.fixture(autouse=True)
def docker_backend(monkeypatch):
    monkeypatch.setenv("QUINEBOX_BACKEND", "docker")


PROBE = "env | sort; id; pwd; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status; ulimit -a; mount | grep -E ' /(world|tmp) '"


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


def wait_for(condition, what: str, timeout: float = 60.0, shown=lambda: "") -> None:
    """Until `condition()`; past `timeout`, fails saying `what` and what `shown()` says of the state then."""
    until = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < until, f"timed out waiting for {what} {shown()}".rstrip()
        time.sleep(0.2)


def pool_boxes(engine, keeper: str) -> list[dict]:
    """The boxes one pool made (its keeper's `pid:start` ends their owner label), claimed or not. The start too: pids
    wrap here (pid_max 32768), and a box of another keeper with the same pid is not this one's."""
    made = engine.api.containers(all=True, filters={"label": LABEL_POOL})
    return [box for box in made if box["Labels"][LABEL_OWNER].split(":", 1)[1] == keeper]


def keeper_of(said: dict) -> str:
    """The `pid:start` of the keeper that `serve status` said, read while it runs."""
    pid = said["pool"]["pid"]
    return f"{pid}:{process_start_ticks(pid)}"


def keeper(env) -> str:
    return keeper_of(status(env))


def leftovers(engine, keeper: str, env: dict) -> str:
    """What a failed wait for a pool's boxes to go shows: each box left, as the engine has it, and the server's log."""
    boxes = [f"{box['Names']} {box['State']} ({box['Status']}), created {box['Created']}" for box in pool_boxes(engine, keeper)]
    log = os.path.join(env["QUINEBOX_STATE_DIR"], "serve.log")
    return f"left: {boxes}; serve.log ends: {open(log).read()[-3000:] if os.path.exists(log) else None!r}"


@pytest.fixture
def pooled(tmp_path):
    """A state dir with a command server keeping 2 warm boxes per shape; the environment that reaches it."""
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env["QUINEBOX_SERVE"] = "manual"
    env.pop("QUINEBOX_POOL", None)
    started = quinebox_cli("serve", "--background", "--pool", "2", env=env)
    assert started.returncode == 0, started.stderr
    wait_for(lambda: warm_count(env) == 2, "the default shape's warm boxes")
    yield env
    quinebox_cli("serve", "stop", env=env)


def own_paths(inspect: dict) -> dict:
    """A container's constraints: its HostConfig and Config, less its identity, command and environment,
    and with the host paths of its lifeline and world (its own, warm or cold) named by what they are."""
    host = dict(inspect["HostConfig"])
    host["Mounts"] = [
        {**m, "Source": "<own>"} if m["Target"] in ("/world", HOST_SOCKET) else m for m in host.get("Mounts") or []
    ]
    config = {k: v for k, v in inspect["Config"].items() if k not in ("Cmd", "Env", "Labels")}
    config["Labels"] = {LABEL_USER: inspect["Config"]["Labels"][LABEL_USER]}
    return {"host": host, "config": config}


@pytest.mark.parametrize("grants", [[], ["mem:300M"]], ids=["default", "memory-set-at-the-claim"])
def test_a_claimed_box_is_configured_and_behaves_exactly_as_a_cold_one(pooled, monkeypatch, engine, grants):
    monkeypatch.setenv("QUINEBOX_STATE_DIR", pooled["QUINEBOX_STATE_DIR"])
    monkeypatch.delenv("QUINEBOX_POOL", raising=False)
    before = hits(pooled)
    warm = quinebox.Popen(["sleep", "60"], grants=grants, stdin=quinebox.DEVNULL)
    monkeypatch.setenv("QUINEBOX_POOL", "off")
    cold = quinebox.Popen(["sleep", "60"], grants=grants, stdin=quinebox.DEVNULL)
    try:
        assert warm.claimed is not None and cold.claimed is None
        assert hits(pooled) == before + 1
        claimed, started = (engine.api.inspect_container(box.id) for box in (warm, cold))
        assert own_paths(claimed) == own_paths(started)
        assert claimed["HostConfig"]["Memory"] == (300 << 20 if grants else 1 << 30)
        assert claimed["Config"]["Cmd"] == list(POOL_COMMAND)  # what it was told to run came after, over its lifeline
    finally:
        warm.kill()
        cold.kill()
        warm.wait(), cold.wait()
    # What a command sees inside, warm or cold: the same environment, user, directory, capabilities, limits and mounts.
    monkeypatch.delenv("QUINEBOX_POOL")
    wait_for(lambda: warm_count(pooled) == 2, "the pool to refill")
    probe = PROBE + "; cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
    seen_warm = quinebox.exec(["sh", "-c", probe], grants=["env:GIVEN=by-the-caller", *grants])
    monkeypatch.setenv("QUINEBOX_POOL", "off")
    seen_cold = quinebox.exec(["sh", "-c", probe], grants=["env:GIVEN=by-the-caller", *grants])
    assert hits(pooled) == before + 2
    assert seen_warm.returncode == seen_cold.returncode == 0, seen_warm.stderr + seen_cold.stderr
    assert b"GIVEN=by-the-caller" in seen_warm.stdout
    assert seen_warm.stdout.replace(seen_warm.session.encode(), b"S") == seen_cold.stdout.replace(seen_cold.session.encode(), b"S")


def test_a_warm_box_holds_nothing_of_a_command_before_its_claim(pooled, engine):
    [box, *_] = pool_boxes(engine, keeper(pooled))
    inspect = engine.api.inspect_container(box["Id"])
    assert inspect["Config"]["Cmd"] == list(POOL_COMMAND)
    assert not any(e.startswith(("QUINEBOX_", "HTTP_PROXY", "GIVEN")) for e in inspect["Config"]["Env"] or [])
    assert inspect["Config"]["Labels"][LABEL_SESSION].startswith("pool-")
    assert {m["Destination"] for m in inspect["Mounts"]} == {"/world", "/.quinebox", HOST_SOCKET}
    assert inspect["HostConfig"]["NetworkMode"] == "none" and inspect["HostConfig"]["ReadonlyRootfs"]
    listed = quinebox_cli("ps", env=pooled)
    assert b"pool-" not in listed.stdout  # the pool's, not anyone's command


def test_commands_agents_and_their_empty_world_children_draw_from_the_pool_with_the_clis_behaviour(pooled, tmp_path):
    before = hits(pooled)
    done = quinebox_cli("exec", "--json", "--", "sh", "-c", "cat; echo err >&2; touch /world/made; exit 3", env=pooled, input=b"\x00in\xff")
    assert (done.returncode, done.stdout) == (3, b"\x00in\xff")
    facts = json.loads(done.stderr.decode().splitlines()[-1])
    assert facts["exit_code"] == 3 and done.stderr.startswith(b"err\n")
    exported = quinebox_cli("world", "export", facts["session"], env=pooled)
    assert exported.returncode == 0, exported.stderr
    assert [member.name.lstrip("./") for member in tarfile.open(fileobj=io.BytesIO(exported.stdout))] == ["made"]
    (tmp_path / "leaf.yaml").write_text(json.dumps({"turns": [{"sh": "cat <&3 >&4"}, {"exit": "success"}]}))
    child = {"mission": "copy", "material": "to the child\n", "model": "script:leaf.yaml", "world": "empty"}
    (tmp_path / "parent.yaml").write_text(json.dumps({"turns": [{"fork": {"mode": "wait", "children": [child]}}, {"sh": "echo parent done >&4"}, {"exit": "success"}]}))
    wait_for(lambda: warm_count(pooled) == 2, "the pool to refill")
    ran = quinebox_cli("run", "-q", "--json", "-m", f"script:{tmp_path / 'parent.yaml'}", "-g", "spawn:1", "-g", "depth:1", "delegate", env=pooled)
    assert (ran.returncode, ran.stdout) == (0, b"parent done\n"), ran.stderr
    assert hits(pooled) == before + 3  # the command, the agent, and its child
    tree = quinebox_cli("tree", json.loads(ran.stderr.decode().splitlines()[-1])["session"], env=pooled)
    assert tree.returncode == 0 and tree.stdout.count(b"copy") == 1 and b"delegate" in tree.stdout, tree.stdout + tree.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["-g", "ro:{here}=/h"],
        ["-g", "net:example.com"],
        ["--world-from", "{here}"],
    ],
    ids=["host-mount", "network", "world-from"],
)
def test_what_a_warm_box_cannot_serve_starts_cold_and_works(pooled, args, tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    here.chmod(0o755)
    before = status(pooled)
    done = quinebox_cli("exec", *[a.format(here=here) for a in args], "--", "sh", "-c", "echo ran", env=pooled)
    assert (done.returncode, done.stdout) == (0, b"ran\n"), done.stderr
    after = status(pooled)
    assert hits(pooled) == sum(s["hits"] for s in before["pool"]["shapes"])
    assert sum(s["misses"] for s in after["pool"]["shapes"]) == sum(s["misses"] for s in before["pool"]["shapes"])


def test_a_new_shape_is_a_miss_then_kept_warm_and_status_shows_its_claims(pooled):
    first = quinebox_cli("exec", "-g", "pids:64", "--", "sh", "-c", "cat /sys/fs/cgroup/pids/pids.max", env=pooled)
    assert (first.returncode, first.stdout) == (0, b"64\n"), first.stderr
    [mem] = [s for s in shapes(pooled) if s["misses"] == 1]
    assert mem["hits"] == 0
    wait_for(lambda: [s for s in shapes(pooled) if s["shape"] == mem["shape"]][0]["warm"] == 2, "the new shape's warm boxes")
    second = quinebox_cli("exec", "-g", "pids:64", "--", "sh", "-c", "cat /sys/fs/cgroup/pids/pids.max", env=pooled)
    assert (second.returncode, second.stdout) == (0, b"64\n")
    [mem] = [s for s in shapes(pooled) if s["shape"] == mem["shape"]]
    assert (mem["hits"], mem["misses"]) == (1, 1) and 0 <= mem["p50_ms"] <= mem["p99_ms"]
    shown = quinebox_cli("serve", "status", env=pooled).stdout.decode()
    assert "CLAIM p50/p95/p99 ms" in shown and mem["shape"] in shown


def test_an_empty_pool_falls_back_to_cold_starts_never_to_an_error(pooled):
    jobs = [subprocess.Popen([QUINEBOX, "exec", "--", "sh", "-c", f"echo {n}"], env=pooled, stdout=subprocess.PIPE) for n in range(5)]
    outputs = [job.communicate(timeout=120)[0] for job in jobs]
    assert [job.returncode for job in jobs] == [0] * 5 and outputs == [f"{n}\n".encode() for n in range(5)]
    [default] = shapes(pooled)
    assert default["hits"] == 2 and default["misses"] == 3


def test_a_killed_client_takes_its_claimed_box_within_a_second(pooled, engine):
    before = hits(pooled)
    client = subprocess.Popen([QUINEBOX, "exec", "--", "sleep", "60"], env=pooled)
    wait_for(lambda: hits(pooled) == before + 1, "the claim")
    claimed = os.listdir(os.path.join(pooled["QUINEBOX_STATE_DIR"], "run", "claimed"))
    wait_for(lambda: len(claimed) == 1, "the claim record")
    container = claimed[0].removesuffix(".json")
    client.kill()
    client.wait()
    began = time.monotonic()
    wait_for(lambda: not engine.api.containers(all=True, filters={"id": container}), "the box to go", timeout=10)
    assert time.monotonic() - began < 1.5


def test_a_killed_server_takes_every_box_and_its_clients_exit_125(pooled, engine):
    client = subprocess.Popen([QUINEBOX, "exec", "--", "sleep", "60"], env=pooled, stderr=subprocess.PIPE)
    wait_for(lambda: hits(pooled) == 1, "the claim")
    pool = keeper(pooled)
    boxes = {box["Id"] for box in pool_boxes(engine, pool)}
    assert len(boxes) >= 2  # the claimed one, and the warm ones
    os.kill(status(pooled)["pid"], signal.SIGKILL)
    _, err = client.communicate(timeout=30)
    assert client.returncode == 125 and err.count(b"\n") == 1 and b"command server" in err
    wait_for(lambda: not pool_boxes(engine, pool), "every box of the server to go", timeout=15)
    assert quinebox_cli("gc", env=pooled).returncode == 0
    state = pooled["QUINEBOX_STATE_DIR"]
    assert os.listdir(os.path.join(state, "pool")) == [] and os.listdir(os.path.join(state, "run", "claimed")) == []
    assert sorted(os.listdir(os.path.join(state, "run"))) == ["claimed"]


@pytest.mark.parametrize("end", ["kill -9", "serve stop"])
def test_a_server_that_ends_while_its_pool_fills_leaves_no_box_behind(tmp_path, engine, end):
    """Its keeper may be in the middle of an engine create: the box that create makes must go too, however late."""
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config"), "QUINEBOX_SERVE": "manual"}
    env.pop("QUINEBOX_POOL", None)
    (tmp_path / "config" / "quinebox").mkdir(parents=True)
    (tmp_path / "config" / "quinebox" / "config.yaml").write_text("pool: {size: 12, creates: 2, after: 0}\n")  # after 0: the pool starts with the server
    for _ in range(3):  # a create is in flight about half the time while the pool fills: three ends, one or more mid-create
        assert quinebox_cli("serve", "--background", env=env).returncode == 0
        said = status(env)
        pool = keeper_of(said)
        wait_for(lambda: 1 <= warm_count(env) < 12, "the pool filling")
        if end == "kill -9":
            os.kill(said["pid"], signal.SIGKILL)
        else:
            assert quinebox_cli("serve", "stop", env=env).returncode == 0
        # A make under way is waited for up to SETTLE_TIMEOUT (an engine slow under load), then its box goes
        wait_for(lambda: not pool_boxes(engine, pool), "every box of the pool to go", timeout=SETTLE_TIMEOUT + 30, shown=lambda: leftovers(engine, pool, env))
        time.sleep(3)  # a create the engine finishes late would show by now
        assert pool_boxes(engine, pool) == [], leftovers(engine, pool, env)
        wait_for(lambda: not os.path.exists(f"/proc/{said['pool']['pid']}"), "the keeper gone", timeout=SETTLE_TIMEOUT + 30)
    state = env["QUINEBOX_STATE_DIR"]
    left = {"claimed"} | ({SERVE_SOCKET} if end == "kill -9" else set())  # a killed server cannot unlink its socket: the next one binds over it
    assert os.listdir(os.path.join(state, "pool")) == [] and set(os.listdir(os.path.join(state, "run"))) <= left


def test_a_warm_box_whose_create_failed_by_its_deadline_but_was_made_is_removed(tmp_path, monkeypatch, engine):
    """A create the engine finishes after the keeper stopped waiting for it makes a box nobody knows the id of, which,
    never started, the engine would never remove: it is removed by its name."""
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    backend = DockerBackend.connect()
    shape = default_shape(Makers())
    made = []

    def late(config):  # the engine made it, but answered after the request's deadline
        made.append(real(config))
        raise EngineError("the Docker engine did not answer the request to create a box in time")

    real, backend.create = backend.create, late
    with pytest.raises(EngineError):
        start_warm(backend, shape)
    assert len(made) == 1 and engine.api.containers(all=True, filters={"id": made[0]}) == []
    assert os.listdir(tmp_path / "state" / "run") == []


def test_idle_shapes_and_their_warm_boxes_are_reaped_after_the_ttl(tmp_path, engine):
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("QUINEBOX_POOL", None)
    (tmp_path / "config" / "quinebox").mkdir(parents=True)
    (tmp_path / "config" / "quinebox" / "config.yaml").write_text("pool: {size: 1, ttl: 4, after: 0}\n")  # after 0: the pool starts with the server
    assert quinebox_cli("serve", "--background", env=env).returncode == 0
    try:
        wait_for(lambda: warm_count(env) == 1, "the warm box")
        [box] = [b["Id"] for b in pool_boxes(engine, keeper(env))]
        wait_for(lambda: shapes(env) == [], "the idle shape to be dropped", timeout=15)
        wait_for(lambda: not engine.api.containers(all=True, filters={"id": box}), "its warm box to go", timeout=10)
    finally:
        quinebox_cli("serve", "stop", env=env)


def test_serve_stop_ends_the_pool_and_lets_running_commands_finish(pooled, engine):
    client = subprocess.Popen([QUINEBOX, "exec", "--", "sh", "-c", "sleep 2; echo finished"], env=pooled, stdout=subprocess.PIPE)
    wait_for(lambda: hits(pooled) == 1, "the claim")
    pool = keeper(pooled)
    assert quinebox_cli("serve", "stop", env=pooled).returncode == 0
    out, _ = client.communicate(timeout=60)
    assert (client.returncode, out) == (0, b"finished\n")
    wait_for(lambda: not pool_boxes(engine, pool), "the warm boxes to go", timeout=15)


def test_without_a_pool_nothing_is_claimed(tmp_path):
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state")}
    env.pop("QUINEBOX_POOL", None)
    assert quinebox_cli("serve", "--background", "--pool", "0", env=env).returncode == 0
    try:
        assert status(env)["pool"] is None
        done = quinebox_cli("exec", "--", "echo", "cold", env=env)
        assert (done.returncode, done.stdout) == (0, b"cold\n")
        assert b"pool: none" in quinebox_cli("serve", "status", env=env).stdout
    finally:
        quinebox_cli("serve", "stop", env=env)
