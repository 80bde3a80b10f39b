"""The Inspect AI provider (quinebox/integrations/inspect_sandbox.py) against real boxes and real evals.

- Inspect's own conformance suite (inspect_ai.util._sandbox.self_check), each check a test of its own, on the
  default backend (an OCI runtime) and on the Docker engine; the checks a quinebox box does not pass are strict
  xfails that say why (no root by design; write_file over a read-only file, a gap of quinebox.Sandbox's).
- what the suite does not look at: output past Inspect's limit, timeouts and cancellation end the command's
  whole tree (seen in /proc), root is SandboxUserUnsupportedError, environments, connection, cleanup.
- `inspect_ai.eval()` of tests/inspect_task.py in a process of its own, with the mock model and samples in
  parallel: their commands ran in boxes of the configured (Dockerfile-built) image; no box is left afterwards.
- `kill -9` of an eval whose samples are mid-command: its boxes go with it.
"""

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from inspect_ai.util import OutputLimitExceededError, SandboxUnavailableError, SandboxUserUnsupportedError
from inspect_ai.util._sandbox import self_check
from inspect_ai.util._sandbox.limits import override_max_exec_output_size, override_max_read_file_size
from commands import BOX_UID, QUINEBOX, ROOTLESS, qb
from inspect_task import HOLD_MARK, IMAGE_MARK, NO_MARK
from live_boxes import live_boxes, runs_in, soon

from quinebox.box.policy import LABEL_OWNER
from quinebox.box.spec import DEFAULT_IMAGE
from quinebox.errors import QuineboxError
from quinebox.integrations.inspect_sandbox import QuineboxSandboxConfig, QuineboxSandboxEnvironment

INSPECT = str(Path(sys.executable).with_name("inspect"))
TASK = Path(__file__).parent.parent / "inspect_task.py"

BACKENDS = ("oci", "docker")
ROOT = "the root is read-only (adduser cannot write /etc), and root is refused where the box has no user namespace of its own"
#: self_check's checks a quinebox box fails, each with why (on every backend).
XFAIL = {
    "test_exec_as_user": f"adds a user with `adduser` as root, then runs `whoami` as root: {ROOT}",
}


def checks() -> list:
    return [
        pytest.param(backend, name, id=f"{backend}-{name.removeprefix('test_')}",
                     marks=[pytest.mark.xfail(strict=True, reason=XFAIL[name])] if name in XFAIL else [])
        for backend in BACKENDS
        for name in sorted(self_check.__all__)
    ]


@pytest.fixture(scope="module")
def sandbox_envs(engine):
    """One sample's sandbox per backend, made on first use, shared by the checks (as Inspect's runner does)."""
    made: dict[str, dict] = {}

    def get(backend: str) -> QuineboxSandboxEnvironment:
        if backend not in made:
            config = QuineboxSandboxConfig(backend=backend)
            made[backend] = anyio.run(QuineboxSandboxEnvironment.sample_init, "self_check", config, {})
        return made[backend]["default"]

    yield get
    for backend, environments in made.items():
        anyio.run(QuineboxSandboxEnvironment.sample_cleanup, "self_check", QuineboxSandboxConfig(backend=backend), environments, False)


@pytest.mark.parametrize("backend, check", checks())
def test_self_check(sandbox_envs, backend, check):
    anyio.run(getattr(self_check, check), sandbox_envs(backend))


def test_connection_is_a_command_a_person_can_paste(sandbox_envs):
    env = sandbox_envs("oci")
    connection = anyio.run(env.connection)
    assert connection.type == "quinebox"
    assert connection.command == f"quinebox exec --in {connection.container} -it -- sh"
    argv = [QUINEBOX, *connection.command.replace(" -it ", " ").split()[1:], "-c", "echo hi from $(hostname)"]
    done = subprocess.run(argv, capture_output=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, b"hi from box\n"), done.stderr


def leftovers(env: QuineboxSandboxEnvironment, marker: str) -> int:
    """How many processes in the box have `marker` in their command line, from /proc (the agent image has no ps:
    self_check's ps-based timeout checks pass there however the tree ends, so these tests look for themselves)."""
    pattern = f"{marker[:-1]}[{marker[-1]}]"  # matches the marker, not this pattern in our own command line
    script = f"sleep 0.5; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' <$f; echo; done | grep -c '{pattern}' || true"
    return int(anyio.run(env.exec, ["sh", "-c", script]).stdout)


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_past_the_limit_kills_the_command_and_raises(sandbox_envs, backend):
    env = sandbox_envs(backend)

    async def flood() -> None:
        with override_max_exec_output_size(1 << 20):
            await env.exec(["sh", "-c", "echo begun; yes flood-marker; :"])

    began = time.monotonic()
    with pytest.raises(OutputLimitExceededError, match="limit of 1 MiB was exceeded") as raised:
        anyio.run(flood)
    assert time.monotonic() - began < 10
    assert raised.value.truncated_output.startswith("begun\nflood-marker\n")
    assert leftovers(env, "flood-marker") == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_timeout_kills_the_whole_tree_and_says_what_it_printed(sandbox_envs, backend):
    env = sandbox_envs(backend)
    with pytest.raises(TimeoutError) as raised:
        anyio.run(functools.partial(env.exec, ["sh", "-c", "echo started; setsid sleep 60 & sleep 60; : tree-marker"], timeout=1))
    assert raised.value.truncated_output == "started\n"
    assert leftovers(env, "tree-marker") == 0
    assert leftovers(env, "sleep 60") == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cancelled_exec_kills_its_command(sandbox_envs, backend):
    """A sample's time limit cancels its tool call: the command must not go on running in the box."""
    env = sandbox_envs(backend)

    async def cut_short() -> None:
        with anyio.move_on_after(1):
            await env.exec(["sh", "-c", "sleep 60; : cancel-marker"])

    began = time.monotonic()
    anyio.run(cut_short)
    assert time.monotonic() - began < 5
    assert leftovers(env, "cancel-marker") == 0


@pytest.mark.root_only  # the Docker engine: the rootless pass's user has none
def test_root_is_unsupported_not_a_failed_command_where_the_box_has_no_user_namespace(sandbox_envs):
    env = sandbox_envs("docker")
    for user in ("root", "0", "0:0"):
        with pytest.raises(SandboxUserUnsupportedError, match="root"):
            anyio.run(functools.partial(env.exec, ["id"], user=user))
    assert anyio.run(functools.partial(env.exec, ["id", "-u"], user="1000")).stdout == "1000\n"
    # A runc box's own user namespace makes its root no one outside: honored there (test_root_exec.py).
    assert anyio.run(functools.partial(sandbox_envs("oci").exec, ["id", "-u"], user="root")).stdout == "0\n"


def test_each_environment_is_a_box_of_its_own_default_first(engine):
    config = QuineboxSandboxConfig(limits={"mem": "256m"}, environments={"victim": {"workdir": "/tmp"}})
    environments = anyio.run(QuineboxSandboxEnvironment.sample_init, "envs", config, {})
    try:
        assert list(environments) == ["default", "victim"]
        default, victim = environments.values()
        anyio.run(default.write_file, "mine.txt", "default's")
        assert anyio.run(victim.exec, ["pwd"]).stdout == "/tmp\n"
        with pytest.raises(FileNotFoundError):
            anyio.run(victim.read_file, "/world/mine.txt")
        assert anyio.run(default.read_file, "/world/mine.txt") == "default's"
    finally:
        anyio.run(QuineboxSandboxEnvironment.sample_cleanup, "envs", config, environments, False)
    assert soon(lambda: [b for b in live_boxes(engine) if b.labels.get("io.quinebox.session") in {default._sandbox.id, victim._sandbox.id}]) == []


def test_inspect_sandbox_cleanup_removes_boxes(engine, tmp_path):
    """`inspect sandbox cleanup quinebox ID` removes that box (its sample then finds its sandbox unavailable);
    with no ID, every box of the provider's (a held one as if an eval left it), and nothing else."""
    environments = anyio.run(QuineboxSandboxEnvironment.sample_init, "cleanup", QuineboxSandboxConfig(), {})
    env = environments["default"]
    done = subprocess.run([INSPECT, "sandbox", "cleanup", "quinebox", env._sandbox.id], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert env._sandbox.id in done.stdout.decode()
    with pytest.raises(SandboxUnavailableError):
        anyio.run(env.exec, ["true"])
    anyio.run(QuineboxSandboxEnvironment.sample_cleanup, "cleanup", QuineboxSandboxConfig(), environments, False)

    state = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state")}  # none of this session's boxes
    left = qb("box", "create", "--name", "inspect-left-behind", env=state).stdout.decode().strip()
    other = qb("box", "create", "--name", "someone-elses", env=state).stdout.decode().strip()
    try:
        done = subprocess.run([INSPECT, "sandbox", "cleanup", "quinebox"], capture_output=True, timeout=60, env=state)
        assert done.returncode == 0, done.stderr
        listed = qb("box", "ls", env=state).stdout.decode()
        assert left not in listed and other in listed, listed
    finally:
        qb("box", "rm", left, other, env=state)


# -- a real eval --------------------------------------------------------------------------------------------


def owned_by(engine, pid: int) -> list:
    """The boxes (of either backend) whose owner is process `pid`."""
    return [box for box in live_boxes(engine) if box.labels.get(LABEL_OWNER, "").split(":")[1:2] == [str(pid)]]


#: What the samples' image holds at IMAGE_MARK: a Dockerfile's build; in the rootless pass, with no engine to
#: build one, the agent image named by `image:`, which holds nothing there.
MARKED = NO_MARK if ROOTLESS else "built-for-inspect"


def write_config(tmp_path: Path, backend: str | None = None) -> Path:
    """A config file as a user writes one: a Dockerfile beside it, built once for the task (the rootless
    pass: the agent image by name); a memory limit."""
    if ROOTLESS:
        image = f"image: {DEFAULT_IMAGE}"
    else:
        (tmp_path / "Dockerfile").write_text(f"FROM {DEFAULT_IMAGE}\nUSER root\nRUN echo built-for-inspect > {IMAGE_MARK}\nUSER agent\n")
        image = "dockerfile: Dockerfile"
    config = tmp_path / "quinebox.yaml"
    config.write_text(f"{image}\nlimits:\n  mem: 512m\n  pids: 256\n{f'backend: {backend}' if backend else ''}\n")
    return config


def inspect_eval(tmp_path: Path, config: Path, *hold: str) -> list[str]:
    """`inspect_ai.eval()` of tests/inspect_task.py in a process of its own (the entry point found afresh)."""
    return [sys.executable, str(TASK), str(config), str(tmp_path / "logs"), *hold]


def test_a_dockerfile_with_no_engine_to_build_it_is_one_line_at_task_start(tmp_path, monkeypatch):
    """A user with no engine (here DOCKER_HOST names a socket nothing listens on; in the rootless pass, the
    engine's socket is not theirs): the task's start says in one line why its Dockerfile cannot be built and
    what to give instead; no box is made."""
    (tmp_path / "Dockerfile").write_text(f"FROM {DEFAULT_IMAGE}\n")
    (tmp_path / "quinebox.yaml").write_text("dockerfile: Dockerfile\n")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(QuineboxError) as refused:
        anyio.run(QuineboxSandboxEnvironment.task_init, "no-engine", str(tmp_path / "quinebox.yaml"))
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith(f"cannot build {tmp_path / 'Dockerfile'}: a Dockerfile is built by the Docker engine, and it "), said
    assert f"nothing listens on {tmp_path}/no-engine.sock" in said and "give the config an `image:` instead" in said, said


def test_inspect_eval_runs_every_sample_in_a_box_of_its_own(engine, tmp_path):
    config = write_config(tmp_path)
    proc = subprocess.Popen(inspect_eval(tmp_path, config), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out.decode(errors="replace")[-4000:]
    [log_file] = (tmp_path / "logs").glob("*.json")
    log = json.loads(log_file.read_text())
    assert log["status"] == "success", log.get("error")
    samples = log["samples"]
    assert len(samples) == 4
    boxes = set()
    for sample in samples:
        where = sample["metadata"]["where"]
        assert where["returncode"] == 0, where
        pid1, uid, hostname, image_mark, written = where["stdout"].splitlines()
        assert "signal.pause()" in pid1  # pid 1 of its pid namespace is the box's own holder
        assert (uid, hostname, image_mark) == (str(BOX_UID), "box", MARKED)
        assert written == sample["input"]
        assert sample["scores"]["read_back"]["value"] == 1
        boxes.add(sample["metadata"]["connection"])
    assert len(boxes) == 4  # a box per sample
    spans = sorted(sample["metadata"]["span"] for sample in samples)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), f"no two samples ran at once: {spans}"
    assert soon(lambda: owned_by(engine, proc.pid), within=2) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_9_of_inspect_eval_mid_command_leaves_no_box(engine, tmp_path, backend):
    config = write_config(tmp_path, backend)
    proc = subprocess.Popen(inspect_eval(tmp_path, config, "120"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            boxes = owned_by(engine, proc.pid)
            if len(boxes) == 3 and all(runs_in(box, HOLD_MARK.encode()) for box in boxes):
                break
            assert proc.poll() is None, "inspect eval ended before its samples held their boxes"
            time.sleep(0.2)
        else:
            pytest.fail(f"the samples' commands never all ran: {owned_by(engine, proc.pid)}")
        assert {box.backend for box in boxes} == ({"docker"} if backend == "docker" else {"runc"})
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert soon(lambda: owned_by(engine, proc.pid), within=5) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_and_write_of_what_the_box_planted_fail_at_once(sandbox_envs, backend):
    """A FIFO, a socket, devices behind links: PermissionError saying which; a file past Inspect's read limit:
    OutputLimitExceededError at once (its size says so); the box answers afterwards."""
    env = sandbox_envs(backend)
    plant = ("mkfifo /tmp/fifo && ln -s /dev/zero /tmp/zero && head -c 2048 /dev/zero > /tmp/big && "
             "/.quinebox/lib/ld.so --library-path /.quinebox/lib /.quinebox/lib/python3 -I -S "
             "-c \"import socket; socket.socket(socket.AF_UNIX).bind('/tmp/sock')\"")
    assert anyio.run(functools.partial(env.exec, ["sh", "-c", plant])).success
    for path, words in [("/tmp/fifo", "a FIFO"), ("/tmp/sock", "a socket"), ("/tmp/zero", "a character device"), ("/dev/null", "a character device")]:
        for call in (functools.partial(env.read_file, path), functools.partial(env.write_file, path, "x")):
            began = time.monotonic()
            with pytest.raises(PermissionError, match=words):
                anyio.run(call)
            print(f"\nplanted inspect {backend} {call.func.__name__} {path}: {time.monotonic() - began:.3f} s")
            assert time.monotonic() - began < 5
    with override_max_read_file_size(1024):
        began = time.monotonic()
        with pytest.raises(OutputLimitExceededError):
            anyio.run(functools.partial(env.read_file, "/tmp/big", text=False))
        print(f"\nplanted inspect {backend} read_file over the limit: {time.monotonic() - began:.3f} s")
    assert anyio.run(functools.partial(env.exec, ["echo", "up"])).stdout == "up\n"
