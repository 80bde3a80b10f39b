"""Boxes from images that are not quinebox's: the guest brings its own runtime, the hardening stays the same.

Each test image (tests/images.py) lacks something the agent image has: a
shell, Python, glibc. The lifeline, the agent loop and the in-box `quinebox`
run from the runtime mounted at /.quinebox all the same.
"""

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from openai_server import exit_, sh

import quinebox
from images import ALL, BUSYBOX, MUSL, NOPYTHON, STATIC, load_foreign
from quinebox.box.policy import native_machine
from quinebox.box.spec import DEFAULT_IMAGE
from quinebox.state import run_dir

MISSIONS = Path(__file__).resolve().parents[2] / "examples" / "missions"
IDS = [image.name.split("/")[1] for image in ALL]
#: What must be identical between a box of the agent image and one of any other image.
HARDENING = (
    "CapDrop", "CapAdd", "SecurityOpt", "ReadonlyRootfs", "NetworkMode", "PidsLimit", "Memory", "MemorySwap", "Init",
    "IpcMode", "Tmpfs", "Ulimits", "OomScoreAdj", "AutoRemove", "Privileged", "Devices", "NanoCpus",
)


@pytest.fixture(scope="module", autouse=True)
def images(test_images):
    return test_images


@pytest.mark.parametrize("image", ALL, ids=IDS)
def test_fifty_megabytes_round_trip_byte_exact(image):
    data = os.urandom(50 << 20)
    result = quinebox.exec([image.probe, "cat"], input=data, image=image.name, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout) == len(data) and hashlib.sha256(result.stdout).digest() == hashlib.sha256(data).digest()


@pytest.mark.parametrize("image", ALL, ids=IDS)
def test_stdout_stderr_and_the_exit_status_stay_apart(image):
    said = quinebox.exec([image.probe, "say", "to stdout", "to stderr"], image=image.name)
    assert (said.returncode, said.stdout, said.stderr) == (0, b"to stdout\n", b"to stderr\n")
    assert quinebox.exec([image.probe, "exit", "42"], image=image.name).returncode == 42


@pytest.mark.parametrize("image", ALL, ids=IDS)
def test_a_missing_command_is_127_said_by_the_lifeline(image):
    result = quinebox.exec(["/no/such/tool"], image=image.name)
    assert result.returncode == 127
    assert result.stderr == b"quinebox: /no/such/tool: command not found\n"


@pytest.mark.parametrize("image", ALL, ids=IDS)
def test_memory_and_time_limits_hold(image):
    hog = quinebox.exec([image.probe, "hog"], image=image.name, grants=["mem:32m"], timeout=60)
    assert (hog.returncode, hog.oom_killed) == (137, True)
    slow = quinebox.exec([image.probe, "sleep", "30"], image=image.name, timeout="1s")
    assert (slow.returncode, slow.timed_out) == (124, True)


@pytest.mark.parametrize("image", ALL, ids=IDS)
def test_the_seccomp_profile_refuses_the_same_calls(image):
    answers = dict(line.split(" ", 1) for line in quinebox.exec([image.probe, "syscalls"], image=image.name).stdout.decode().splitlines())
    assert {name: answer for name, answer in answers.items() if name != "clone3"} == dict.fromkeys(
        ["unshare", "mount", "ptrace", "keyctl", "bpf", "io_uring_setup", "clock_settime", "sethostname"], "Operation not permitted"
    )
    assert answers["clone3"] == "Function not implemented"
    relaxed = dict(line.split(" ", 1) for line in quinebox.exec([image.probe, "syscalls"], image=image.name, grants=["syscall:unshare"]).stdout.decode().splitlines())
    assert relaxed["unshare"] == "ok" and relaxed["mount"] == "Operation not permitted"


def running_box(engine, image: str, argv: list[str]):
    box = quinebox.Popen(argv, image=image, stdin=quinebox.DEVNULL)
    if box.choice.backend == "oci":
        return box, json.loads((run_dir() / f"{box.session}.oci" / "config.json").read_text())
    return box, engine.api.inspect_container(box.id)


#: What an OCI box's config says of its hardening, whatever its image: all of it but its command, environment and root.
def oci_hardening(config: dict) -> dict:
    process = {k: v for k, v in config["process"].items() if k not in ("args", "env", "cwd")}
    mounts = [(m["destination"], m["type"], m.get("options")) for m in config["mounts"] if m["destination"] != "/world"]
    linux = {k: v for k, v in config["linux"].items() if k != "cgroupsPath"}
    for key in ("uidMappings", "gidMappings"):  # a root-made box's own host ids (backends/oci/idmap.py): each box's differ
        if key in linux:
            linux[key] = [(m["containerID"], m["size"]) for m in linux[key]]
    return {"process": process, "mounts": mounts, "linux": linux, "readonly": config["root"]["readonly"], "hostname": config["hostname"]}


@pytest.mark.parametrize("backend", ["docker", "oci"])
@pytest.mark.parametrize("image", ALL, ids=IDS)
def test_the_hardening_is_identical_to_the_agent_images(engine, image, backend, monkeypatch):
    monkeypatch.setenv("QUINEBOX_BACKEND", backend)
    ours, ours_info = running_box(engine, DEFAULT_IMAGE, ["sleep", "20"])
    theirs, theirs_info = running_box(engine, image.name, [image.probe, "sleep", "20"])
    try:
        assert ours.choice.backend == theirs.choice.backend == backend
        if backend == "oci":
            assert oci_hardening(ours_info) == oci_hardening(theirs_info)
            assert theirs_info["process"]["user"]["uid"] != 0 and theirs_info["root"]["readonly"] is True
            [runtime] = [m for m in theirs_info["mounts"] if m["destination"] == "/.quinebox"]
            assert "ro" in runtime["options"]
            return
        for key in HARDENING:
            assert ours_info["HostConfig"][key] == theirs_info["HostConfig"][key], key
        assert ours_info["Config"]["User"] == theirs_info["Config"]["User"] != "0"
        [runtime] = [m for m in theirs_info["Mounts"] if m["Destination"] == "/.quinebox"]
        assert runtime["RW"] is False
    finally:
        for box in (ours, theirs):
            box.kill()
            box.wait()


def test_the_images_environment_reaches_the_command_and_never_the_guest():
    result = quinebox.exec(["sh", "-c", 'echo "$GREETING $PYTHONHOME $PYTHONPATH $HOME"; pwd; command -v python3 || echo no python'], image=NOPYTHON.name)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"hello-from-the-image /nowhere /nowhere /tmp\n/srv\nno python\n"


def test_no_command_runs_the_images_own():
    result = quinebox.exec([], image=STATIC.name)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"the image's own command\n", b"ran\n")


def test_an_agent_in_an_image_without_python_with_the_scripted_model(tmp_path):
    script = tmp_path / "m.yaml"
    script.write_text('turns:\n  - sh: "wc -l <&3 >&4; echo $GREETING >&5"\n  - exit: success\n')
    result = quinebox.run("count the lines", input=b"a\nb\nc\n", image=NOPYTHON.name, model=f"script:{script}")
    assert (result.returncode, result.stdout.strip(), result.termination) == (0, b"3", "exit_success")
    assert b"hello-from-the-image" in result.stderr


@pytest.mark.parametrize("image", [NOPYTHON, MUSL], ids=["nopython", "musl"])
def test_an_agent_in_a_foreign_image_through_the_real_openai_client(fake_openai, image):
    fake_openai.steps = [sh(f"{image.probe} say deliverable ignored >&4 2>/dev/null; ls /.quinebox"), exit_()]
    result = quinebox.run("deliver", image=image.name)
    assert (result.returncode, result.stdout, result.termination) == (0, b"deliverable\n", "exit_success")
    tool_result = [m["content"] for m in fake_openai.requests[1].body["messages"] if m["role"] == "tool"][0]
    assert "bin\nguest\nlib\n" in tool_result


@pytest.mark.skipif(native_machine() == "arm64", reason="the foreign image is arm64's")
def test_an_image_for_another_cpu_is_refused_in_one_line(engine):
    image = load_foreign(engine)
    with pytest.raises(quinebox.QuineboxError) as refused:
        quinebox.exec(["/hello"], image=image)
    assert str(refused.value) == f"image {image} is for arm64, and this machine runs {native_machine()}: quinebox runs native images only"
    assert refused.value.exit_code == 125


def test_an_agent_needs_a_shell_in_its_image():
    with pytest.raises(quinebox.QuineboxError, match="has no /bin/sh"):
        quinebox.run("anything", image=STATIC.name, model=f"script:{MISSIONS / 'count-lines.yaml'}")


def test_a_child_can_use_another_local_image_but_never_makes_the_host_pull(tmp_path):
    script = tmp_path / "m.yaml"
    script.write_text(
        "turns:\n"
        f"  - sh: \"quinebox exec --image {BUSYBOX.name} -- probe say from-the-child x >&4; quinebox exec --image quinebox/absent:9 -- true >&4 2>&1; true\"\n"
        "  - exit: success\n"
    )
    result = quinebox.run("spawn", image=NOPYTHON.name, model=f"script:{script}", grants=["spawn:2", "depth:1"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(b"from-the-child\n")
    assert b"quinebox: image quinebox/absent:9 is not here: --pull never" in result.stdout


def test_sigkill_of_the_host_ends_a_box_of_any_image(engine):
    """The lifeline runs from the injected runtime: no Python in the image is needed for it."""
    import signal
    import subprocess
    import sys

    from live_boxes import live_boxes

    quinebox_cmd = os.path.join(os.path.dirname(sys.executable), "quinebox")
    procs = [subprocess.Popen([quinebox_cmd, "exec", "--image", image.name, "--", image.probe, "sleep", "300"], stdin=subprocess.DEVNULL) for image in ALL]
    deadline = time.monotonic() + 30
    while len([b for b in live_boxes(engine) if b.status == "running"]) < len(ALL) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len([b for b in live_boxes(engine) if b.status == "running"]) == len(ALL)
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while live_boxes(engine) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_boxes(engine) == []


def test_concurrent_first_use_agrees_on_one_runtime(tmp_path, monkeypatch):
    """Many processes may extract the runtime at once; each renames atomically, and all get the same one."""
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.images import guest_runtime

    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path))
    found, backend = [], DockerBackend.connect()
    threads = [threading.Thread(target=lambda: found.append(guest_runtime.runtime_dir(backend, DEFAULT_IMAGE))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(found)) == 1 and os.path.exists(os.path.join(found[0], "lib", "ld.so"))
    assert [p.name for p in (tmp_path / "runtime").iterdir()] == [os.path.basename(found[0])]  # no half-made copies left


#: Eleven refusals in a process of their own (this one's descriptors come and go with earlier tests' threads): its
#: descriptors and the state dir's sockets after the first, then after the other ten.
REFUSALS = """
import json, os, quinebox
from quinebox.state import run_dir

def refused():
    try:
        quinebox.exec(["true"], image="quinebox/absent:1", pull="never")
    except quinebox.QuineboxError as exc:
        assert "is not here" in str(exc), exc
    else:
        raise AssertionError("the absent image was not refused")

refused()  # the first one may open the engine's connection
counts = [(len(os.listdir("/proc/self/fd")), sorted(p.name for p in run_dir().iterdir()))]
for _ in range(10):
    refused()
counts.append((len(os.listdir("/proc/self/fd")), sorted(p.name for p in run_dir().iterdir())))
print(json.dumps(counts))
"""


def test_a_refused_image_starts_nothing_and_holds_nothing(engine):
    done = subprocess.run([sys.executable, "-c", REFUSALS], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    first, after = json.loads(done.stdout)
    assert after == first  # the same number of descriptors, and the same sockets
