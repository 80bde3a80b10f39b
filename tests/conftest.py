"""Shared by every test: each run gets its own state dir, so tests never touch the user's."""

import os

import pytest

#: Boxes made by a user who is not root: only CI's rootless pass (QUINEBOX_TEST_ROOTLESS=1) is such a user.
collect_ignore = [] if os.environ.get("QUINEBOX_TEST_ROOTLESS") == "1" else ["integration/test_rootless_boxes.py"]
#: The agent frameworks' own runs (tests/frameworks/) need their packages, which live in a venv of their own (Python
#: 3.12: Harbor's floor), `.venv-frameworks`; CI runs that directory there with QUINEBOX_TEST_FRAMEWORKS=1, never skipped.
if os.environ.get("QUINEBOX_TEST_FRAMEWORKS") != "1":
    collect_ignore.append("frameworks")


@pytest.fixture(scope="session", autouse=True)
def isolated_state_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Also: a command server only where a test started one (`manual`), never one each test's state dir starts itself
    (it would outlive the test); the tests of the server starting itself say `auto` (tests/e2e/test_serve.py)."""
    path = str(tmp_path_factory.mktemp("quinebox-state"))
    os.environ["QUINEBOX_STATE_DIR"] = path
    os.environ.setdefault("QUINEBOX_SERVE", "manual")
    return path


@pytest.fixture(scope="session", autouse=True)
def command_server(isolated_state_dir):
    """With QUINEBOX_TEST_SERVE=1 (CI's second pass over the CLI's tests), every `quinebox exec/run/map/batch/shell`
    the tests run goes through a command server, the thin client's path; at the end it must have served them."""
    if os.environ.get("QUINEBOX_TEST_SERVE") != "1":
        yield None
        return
    import subprocess

    from commands import QUINEBOX

    started = subprocess.run([QUINEBOX, "serve", "--background"], capture_output=True, timeout=60)
    assert started.returncode == 0, started.stderr
    yield True
    status = subprocess.run([QUINEBOX, "serve", "status"], capture_output=True, timeout=60)
    subprocess.run([QUINEBOX, "serve", "stop"], capture_output=True, timeout=60)
    assert status.returncode == 0 and b" 0 command(s) served" not in status.stdout, status.stdout + status.stderr


@pytest.fixture(scope="session")
def engine():
    """The real Docker engine and the agent image. Missing either is a failure, never a skip.

    With QUINEBOX_TEST_ROOTLESS=1 (CI's pass as a user who is not root and may not use the engine): None, once
    it is sure that is so and that boxes run on the OCI runtime all the same; a test that asks the engine
    itself is not of that pass."""
    import docker

    from quinebox.box.spec import DEFAULT_IMAGE

    if os.environ.get("QUINEBOX_TEST_ROOTLESS") == "1":
        from quinebox.box.backends.choice import choose, on_engine
        from quinebox.box.backends.registry import NAMES

        assert os.geteuid() != 0, "the rootless pass runs as a user who is not root"
        with pytest.raises(docker.errors.DockerException):
            docker.from_env(timeout=10).ping()
        chosen = choose(None, known=NAMES, backend="auto", runtime=None)
        assert not on_engine(chosen.backend), chosen.why
        return None

    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure to connect means the same thing here
        pytest.fail(f"no Docker engine reachable ({exc}); run scripts/setup.sh", pytrace=False)
    try:
        client.images.get(DEFAULT_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"image {DEFAULT_IMAGE} missing; run `quinebox image build`", pytrace=False)
    return client


@pytest.fixture
def fake_openai(monkeypatch):
    """A real OpenAI-compatible HTTP server on loopback, with quinebox configured to use it."""
    from openai_server import FakeOpenAI

    server = FakeOpenAI()
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-" + os.urandom(6).hex())
    monkeypatch.setenv("QUINEBOX_MODEL", "test-model")
    monkeypatch.setenv("QUINEBOX_MAX_RETRIES", "2")
    yield server
    server.close()



@pytest.fixture(scope="session")
def test_images(engine):
    """Images that are not quinebox's: scratch + busybox, musl, Debian without Python, one static binary."""
    from images import build_all

    return build_all(engine)


def _hypothesis_profiles() -> None:
    """CI runs a bounded number of generated examples; bench/fuzz.py sets QUINEBOX_FUZZ=long to keep going."""
    import os

    from hypothesis import settings

    settings.register_profile("ci", max_examples=60, deadline=None, print_blob=True)
    settings.register_profile("long", max_examples=5_000, deadline=None, print_blob=True)
    settings.load_profile(os.environ.get("QUINEBOX_FUZZ", "ci"))


_hypothesis_profiles()


def _left_behind(state: str) -> list[str]:
    """What quinebox still holds of this test session's state dir: boxes, their cgroups, mounts, processes."""
    import glob

    from live_boxes import local_boxes

    from quinebox.box.owners.listing import live_boxes
    from quinebox.processes import owner_alive

    listed = local_boxes()
    found = [f"box {c['Id']} on {c['Runtime']} ({c['State']})" for c in listed]
    # bwrap/box.py's records that name no box it lists (unreadable, or with no id)
    found += [f"bwrap box record {path}" for path in glob.glob(os.path.join(state, "bwrap", "*.json"))
              if os.path.basename(path).removesuffix(".json") not in {c["Id"] for c in listed}]
    try:
        found += [f"engine box {b.container[:12]} (session {b.session}) whose owner is gone" for b in live_boxes() if b.backend == "docker" and not owner_alive(b.owner)]
    except Exception:  # noqa: BLE001 - no engine: the tests that needed one failed already
        pass
    sessions = set(os.listdir(os.path.join(state, "sessions"))) if os.path.isdir(os.path.join(state, "sessions")) else set()
    found += [f"cgroup {path}" for path in glob.glob("/sys/fs/cgroup/*/quinebox-*") if path.rpartition("quinebox-")[2] in sessions]
    with open("/proc/self/mountinfo") as mounts:
        found += [f"mount {line.split()[4]}" for line in mounts if state in line]
    mine = {os.getpid(), os.getppid()}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"QUINEBOX_STATE_DIR={state}".encode() + b"\0" not in f.read() + b"\0" or int(pid) in mine:
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            if "quinebox" in cmdline:  # not the engine, which the fault tests restart from here (and leave running)
                found.append(f"process {pid}: {cmdline[:120]}")
        except OSError:
            continue
    return found


def pytest_sessionfinish(session, exitstatus):
    """No box, cgroup, mount or process of quinebox's outlives the test session: a leak is a failure of the run."""
    import time

    state = os.environ.get("QUINEBOX_STATE_DIR")
    if not state or not state.startswith(tempfile_root()) or session.testscollected == 0:
        return
    until = time.monotonic() + 60  # what goes goes in seconds; under CI's load on two cores an engine's removal took more than 15
    while (left := _left_behind(state)) and time.monotonic() < until:
        time.sleep(0.2)
    if left:
        print(f"\nquinebox left {len(left)} thing(s) behind after the tests:\n  " + "\n  ".join(left[:20]))
        session.exitstatus = 1


def tempfile_root() -> str:
    """Where pytest makes the session's own state dir (isolated_state_dir): never the user's, which this check leaves alone."""
    import tempfile

    return tempfile.gettempdir()


def pytest_collection_modifyitems(config, items):
    """The rootless pass (QUINEBOX_TEST_ROOTLESS=1) leaves out what only root has here: a test marked root_only,
    one of the images the engine builds (`test_images`), and each case of a test run once per backend or runtime
    for the Docker backend or gVisor (refused to a rootless user here: rootless.RUNSC). Deselected, said so in the summary, never skipped: those tests ran in the passes as root.

    The bubblewrap passes (QUINEBOX_BACKEND=bwrap) leave out the host box's tests (test_host_image.py), which ask bwrap
    for the one box it refuses by design (backend_under_test.py): that file's bwrap tests assert the refusal, for every
    way of asking, in every pass; the rest ran on runc and gVisor."""
    rootless = os.environ.get("QUINEBOX_TEST_ROOTLESS") == "1"
    bwrap = os.environ.get("QUINEBOX_BACKEND") == "bwrap"
    if not (rootless or bwrap):
        return
    keep, drop = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        engine_case = params is not None and bool({"docker", "runsc"} & {str(v) for v in params.params.values()})  # gVisor: root's here
        built = "test_images" in getattr(item, "fixturenames", ())
        host_box = item.path.name == "test_host_image.py" and "bwrap" not in item.name
        (drop if (rootless and (item.get_closest_marker("root_only") or engine_case or built)) or (bwrap and host_box) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
