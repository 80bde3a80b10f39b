"""`quinebox` as a user runs it: a real process, real pipes, real signals."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from live_boxes import live_boxes, local_boxes

from quinebox.box.policy import LABEL_OWNER, LABEL_SESSION

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
REPO = Path(__file__).resolve().parents[2]


def qb(*args: str, input: bytes = b"", env: dict | None = None, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([QUINEBOX, *args], input=input, capture_output=True, timeout=timeout, env=env, **kw)


def quinebox_boxes(engine):
    return live_boxes(engine)


def creates_since(engine, since: float) -> list:
    if engine is None:  # the rootless pass: no engine to ask for its events, so the boxes the runtimes hold now
        return local_boxes()
    until = time.time() + 0.5
    time.sleep(0.6)
    return list(engine.api.events(since=since, until=until, decode=True, filters={"type": "container", "event": "create", "label": LABEL_SESSION}))


def wait_for_box(engine, pred=lambda boxes: boxes, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        boxes = quinebox_boxes(engine)
        if pred(boxes):
            return boxes
        time.sleep(0.05)
    return quinebox_boxes(engine)


def test_streams_and_exit_status_through_the_cli(engine):
    done = qb("exec", "--", "sh", "-c", "tr a-z A-Z; echo diag >&2; exit 7", input=b"material\n")
    assert (done.returncode, done.stdout, done.stderr) == (7, b"MATERIAL\n", b"diag\n")


def test_the_default_image_has_python(engine):
    """`python`, not only `python3`: what agents and users type, and what LangChain's sandbox suite runs."""
    done = qb("exec", "--", "python", "-c", "print(1)")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"1\n", b"")


def test_50_mb_of_binary_stdin_round_trips(engine, tmp_path):
    blob = tmp_path / "blob"
    blob.write_bytes(os.urandom(50 << 20))
    with blob.open("rb") as f:
        done = subprocess.run([QUINEBOX, "exec", "--", "cat"], stdin=f, capture_output=True, timeout=120)
    assert done.returncode == 0
    assert hashlib.sha256(done.stdout).digest() == hashlib.sha256(blob.read_bytes()).digest()


def test_cmd_options_after_the_command_belong_to_the_command(engine):
    assert qb("exec", "sh", "-c", "echo $0 $1", "--json", "-g").stdout == b"--json -g\n"


@pytest.mark.parametrize(
    "args, code, stderr_words",
    [
        (["--", "sh", "-c", "exit 42"], 42, b""),
        (["--", "no-such-cmd"], 127, b"no-such-cmd: command not found"),
        (["--", "/etc/hostname"], 126, b"cannot execute"),
        (["--timeout", "1", "--", "sleep", "30"], 124, b"time limit"),
        (["--memory", "48m", "--", "python3", "-c", "bytearray(256 << 20)"], 137, b"out of memory"),
        (["-g", "nonsense:1", "--", "true"], 125, b"unknown grant"),
        (["-g", "nonsense", "--", "true"], 125, b"expected KIND:VALUE"),
        (["-g", "ro:/etc", "--", "true"], 125, b"never granted"),
        (["-g", "rw:/var/run/docker.sock", "--", "true"], 125, b"never granted"),
        (["--memory", "lots", "--", "true"], 125, b"bad size"),
        (["--timeout", "soon", "--", "true"], 125, b"bad duration"),
        (["--policy", "nope", "--", "true"], 125, b"not found"),
        (["-w", "relative", "--", "true"], 125, b"absolute path"),
        (["--image", "quinebox/absent:0", "--", "true"], 125, b"cannot pull quinebox/absent:0 (is a registry reachable?)"),
        (["--image", "quinebox/absent:0", "--pull", "never", "--", "true"], 125, b"image quinebox/absent:0 is not here: --pull never"),
        (["--image", "quinebox/absent:0", "--pull", "sometimes", "--", "true"], 125, b"bad --pull 'sometimes'"),
        (["--no-such-option", "--", "true"], 2, b"No such option"),
    ],
)
def test_exit_code_table(engine, args, code, stderr_words):
    done = qb("exec", *args)
    assert done.returncode == code, done.stderr
    assert stderr_words in done.stderr


def test_oom_with_surviving_pid_1_says_so_and_json_reports_it(engine):
    done = qb("exec", "--json", "--memory", "48m", "--", "sh", "-c", "python3 -c 'bytearray(256 << 20)'; echo alive")
    assert (done.returncode, done.stdout) == (0, b"alive\n")
    lines = done.stderr.decode().strip().splitlines()
    assert any("out of memory" in line for line in lines)
    summary = json.loads(lines[-1])
    assert summary["oom_killed"] is True and summary["exit_code"] == 0 and summary["timed_out"] is False
    assert set(summary) == {"exit_code", "timed_out", "oom_killed", "duration_s", "session", "backend"}


def test_refusals_are_one_line_and_create_nothing(engine):
    since = time.time()
    for grant in ("ro:/", "ro:/proc/self", "rw:/etc/shadow", "bad:grant", "ro:/no/such/path", f"ro:{os.environ['QUINEBOX_STATE_DIR']}"):
        done = qb("exec", "-g", grant, "--", "true")
        assert done.returncode == 125
        assert done.stderr.count(b"\n") == 1 and done.stderr.startswith(b"quinebox: ")
    assert creates_since(engine, since) == []


def test_unreachable_engine_is_125_with_a_hint(engine):
    """On the Docker backend (on an OCI runtime a box of an unpacked image needs no engine: test_oci_backend.py)."""
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock", "QUINEBOX_BACKEND": "docker"}
    done = qb("exec", "--", "true", env=env)
    assert done.returncode == 125
    assert done.stderr.startswith(b"quinebox: cannot reach the Docker engine") and b"doctor" in done.stderr
    assert done.stderr.count(b"\n") == 1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_to_quinebox_kills_and_removes_the_box_first(engine, signum):
    proc = subprocess.Popen([QUINEBOX, "exec", "--", "sleep", "60"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert wait_for_box(engine, lambda boxes: any(b.status == "running" for b in boxes))
    proc.send_signal(signum)
    assert proc.wait(timeout=15) == 128 + signum
    assert quinebox_boxes(engine) == []


JOB_CONTROL_SIGNALS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def _start_as_a_job(argv: list[str]) -> subprocess.Popen:
    """As a job-control shell starts a job: in a process group of its own, below a parent (this test) of the same
    session, with the stop signals at their default. How the runner was started must not decide the outcome: the
    kernel discards SIGTSTP/SIGTTIN/SIGTTOU sent to a member of an orphaned process group (no member's parent in
    another group of the same session), which the test's own group is under a detached CI runner (`setsid`, a
    service, a background job of a shell without job control); and SIG_IGN set by the runner (`trap '' TSTP`)
    survives exec. A shell puts each job in its own group, so its Ctrl-Z always arrives."""

    def stoppable() -> None:
        for signum in JOB_CONTROL_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)

    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0,
                            preexec_fn=stoppable)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_stopped_and_continued_quinebox_finishes_as_if_never_stopped(engine):
    """Job control (Ctrl-Z, then `fg`): the terminal stops the whole job, its process group, and `fg` continues it.
    The box runs on meanwhile, as any box's does, and the result is as it was."""
    proc = _start_as_a_job([QUINEBOX, "exec", "--", "sh", "-c", "sleep 1; echo done"])
    try:
        assert wait_for_box(engine, lambda boxes: any(b.status == "running" for b in boxes))
        os.killpg(proc.pid, signal.SIGTSTP)
        until = time.monotonic() + 10
        while _state(proc.pid) != "T":
            assert time.monotonic() < until, "SIGTSTP did not stop quinebox"
            time.sleep(0.01)
        time.sleep(2)  # past the command's end
        assert proc.poll() is None and _state(proc.pid) == "T"
        os.killpg(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=30)
        assert (proc.returncode, out, err) == (0, b"done\n", b"")
        assert wait_for_box(engine, lambda boxes: boxes == [], timeout=10) == []
    finally:
        if proc.poll() is None:  # failed while stopped: nothing of it is left stopped, or running
            proc.kill()
            proc.communicate(timeout=30)


def test_sigkill_of_quinebox_leaves_no_box_within_10_s(engine):
    proc = subprocess.Popen([QUINEBOX, "exec", "--", "sh", "-c", "trap '' TERM HUP INT; sleep 300 & sleep 300"], stdin=subprocess.DEVNULL)
    assert wait_for_box(engine, lambda boxes: any(b.status == "running" for b in boxes))
    proc.kill()
    proc.wait()
    assert wait_for_box(engine, lambda boxes: boxes == [], timeout=10) == []


def test_a_closed_reader_stops_the_box(engine):
    done = subprocess.run(f"{QUINEBOX} exec -- yes | head -n 2", shell=True, capture_output=True, timeout=30)
    assert done.stdout == b"y\ny\n"
    assert wait_for_box(engine, lambda boxes: boxes == [], timeout=10) == []


@pytest.mark.root_only
def test_ps_lists_a_live_box_and_gc_removes_only_orphans(engine, tmp_path):
    from dataclasses import replace

    import quinebox
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.images.guest_runtime import runtime_dir
    from quinebox.box.images.lookup import resolve_image
    from quinebox.box.policy import container_config, native_arch
    from quinebox.box.spec import build_spec, seccomp_base
    from quinebox.worlds.spec import WorldSpec

    live = quinebox.Popen(["sleep", "60"], stdin=quinebox.DEVNULL)
    # An orphan as a crash between create and start leaves one: created, never
    # started, and owned by a process that no longer exists.
    dead_owner = f"{os.uname().nodename}:{2**22 + 7}:0"
    # Its world an overlay, as an inheriting child's is: the engine makes the volume at create.
    layers = {name: str(tmp_path / name) for name in ("lower", "upper", "work")}
    for path in layers.values():
        os.mkdir(path)
    world = WorldSpec(kind="overlay", layer=layers["upper"], work=layers["work"], lowers=(layers["lower"],))
    orphan = replace(build_spec(["sleep", "61"]), owner=dead_owner, lifeline=None, world=world)
    backend = DockerBackend.connect()
    image = resolve_image(backend, orphan.image)
    backend.create(container_config(orphan, image=image, runtime=runtime_dir(backend, orphan.image), seccomp=seccomp_base(), arch=native_arch()))
    try:
        assert wait_for_box(engine, lambda boxes: len(boxes) == 2 and any(b.status == "running" for b in boxes))
        listing = qb("ps").stdout.decode()
        assert live.session in listing and "sleep 60" in listing
        assert orphan.session in listing and "sleep 61" in listing
        done = qb("gc")
        assert done.returncode == 0 and orphan.session.encode() in done.stderr
        assert live.session.encode() not in done.stderr
        assert live.poll() is None
        assert [b.labels[LABEL_SESSION] for b in quinebox_boxes(engine)] == [live.session]
        assert quinebox_boxes(engine)[0].labels[LABEL_OWNER] != dead_owner
        assert [v.attrs["Labels"][LABEL_SESSION] for v in engine.volumes.list(filters={"label": LABEL_SESSION})] == []  # the orphan's went with it
    finally:
        live.kill()
        live.wait()


@pytest.mark.root_only
def test_demo_runs_and_leaves_nothing(engine, tmp_path):
    """As a user runs it: a state dir of its own, and the command server starting itself (QUINEBOX_SERVE unset)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "QUINEBOX_SERVE", "QUINEBOX_TEST_SERVE")}
    env["PATH"] = f"{Path(QUINEBOX).parent}:{os.environ['PATH']}"
    env["QUINEBOX_STATE_DIR"] = str(tmp_path / "state")
    done = subprocess.run(["bash", str(REPO / "examples" / "demo.sh")], capture_output=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "HELLO FROM THE HOST" in out and "sum: 15" in out and "network interfaces: lo" in out
    assert "exit status: 124" in out and "exit status: 137" in out and out.count("exit status: 125") == 2
    assert "The material has 42 lines." in out and "      2 ERROR disk full\n      1 ERROR timeout\n" in out
    assert "depth 0  Survey the ten regions" in out and "depth 1  Survey region " in out  # siblings start in any order
    served = re.search(r"serving: pid (\d+), since [^,]+, (\d+) command\(s\) served", out)
    assert served and int(served[2]) > 10, out  # the first command started it; most of the rest went through it
    until = time.monotonic() + 30  # `serve stop` ended it: it lets a command still running finish first
    while os.path.exists(f"/proc/{served[1]}") and time.monotonic() < until:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{served[1]}"), "the demo's server is still running"
    assert quinebox_boxes(engine) == []


def test_a_closed_stdin_is_an_empty_material_not_our_own_sockets(engine):
    done = subprocess.run(f"{QUINEBOX} exec -- sh -c 'cat; echo eof-seen' <&-", shell=True, capture_output=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, b"eof-seen\n")


@pytest.mark.root_only
def test_gc_removes_runtimes_of_older_agent_images_but_never_one_in_use(engine):
    from dataclasses import replace
    from pathlib import Path

    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.images.guest_runtime import runtime_dir, runtime_root
    from quinebox.box.images.lookup import resolve_image
    from quinebox.box.policy import container_config, native_arch
    from quinebox.box.spec import DEFAULT_IMAGE, build_spec, seccomp_base

    backend = DockerBackend.connect()
    current = Path(runtime_dir(backend, DEFAULT_IMAGE))
    stale, in_use = runtime_root() / "0123456789abcdef", runtime_root() / "fedcba9876543210"
    for old in (stale, in_use):
        (old / "lib").mkdir(parents=True)
        (old / "lib" / "ld.so").write_bytes(b"an older agent image's loader")
    # A box (created, alive owner) that still mounts an older runtime.
    spec = replace(build_spec(["true"]), world=None, lifeline=None)
    box = backend.create(container_config(spec, image=resolve_image(backend, spec.image), runtime=str(in_use), seccomp=seccomp_base(), arch=native_arch()))
    try:
        done = qb("gc")
        assert done.returncode == 0, done.stderr
        assert b"removed 1 guest runtime(s) of older agent images: 0123456789abcdef" in done.stderr
        assert not stale.exists() and in_use.exists() and (current / "lib" / "ld.so").exists()
    finally:
        backend.remove(box)
    assert b"fedcba9876543210" in qb("gc").stderr  # once no box mounts it
