"""Shared by every test: each run gets its own state dir, so tests never touch the user's."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def isolated_state_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("quinebox-state"))
    os.environ["QUINEBOX_STATE_DIR"] = path
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
    """The real Docker engine and the agent image. Missing either is a failure, never a skip."""
    import docker

    from quinebox.box.spec import DEFAULT_IMAGE

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
