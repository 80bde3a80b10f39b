"""The Docker engine as a test may break it: stopped, killed, frozen, restarted — and always running again afterwards.

These tests stop the engine that every other test uses, so they run last
(`pytest_collection_modifyitems` below), and each leaves the engine answering.
"""

import os
import signal
import subprocess
import time
from pathlib import Path

import docker
import pytest

HERE = Path(__file__).parent
LOG = "/var/log/quinebox-dockerd.log"


def dockerd_pid() -> int | None:
    """The live dockerd: one killed earlier may linger as a zombie, since PID 1 here reaps slowly."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "dockerd" and not dead(int(entry.name)):
                    return int(entry.name)
            except OSError:
                continue
    return None


def answering(timeout: float = 3) -> bool:
    try:
        docker.from_env(timeout=timeout).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means not answering
        return False


def dead(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


class Engine:
    """The machine's dockerd, by its pid; started again the way scripts/setup.sh starts it."""

    def __init__(self):
        self.pid = dockerd_pid()
        self._ours: subprocess.Popen | None = None  # a dockerd these tests started: ours to reap
        if self.pid is None or not answering():
            pytest.fail("no dockerd running and answering: run scripts/setup.sh", pytrace=False)

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def kill(self) -> None:
        """As a crash would: SIGKILL, and wait until it is gone."""
        self.signal(signal.SIGKILL)
        self._wait_gone()

    def stop(self) -> None:
        """As `systemctl stop docker` would: SIGTERM, and wait until it has shut down."""
        self.signal(signal.SIGTERM)
        self._wait_gone(60)

    def freeze(self) -> None:
        """A wedged engine: it holds its socket open and answers nothing."""
        self.signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline, f"dockerd {self.pid} did not stop"
            time.sleep(0.01)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def start(self) -> None:
        with open(LOG, "ab") as log:
            self._ours = subprocess.Popen(["dockerd"], stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while not answering():
            if time.monotonic() > deadline:
                pytest.fail("dockerd did not come back within 60 s", pytrace=False)
            time.sleep(0.2)
        self.pid = dockerd_pid()

    def _wait_gone(self, timeout: float = 30) -> None:
        """Until dockerd and its containerd have ended; then their pid files go too. A new dockerd
        refuses to start (or waits a minute for containerd) while a pid file names a pid that is
        not yet reaped, and PID 1 on these machines reaps slowly."""
        if self._ours is not None and self._ours.pid == self.pid:
            self._ours.wait(timeout)
        pidfiles = [Path("/var/run/docker.pid"), Path("/var/run/docker/containerd/containerd.pid")]
        for pidfile in pidfiles:
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                continue
            deadline = time.monotonic() + timeout
            while not dead(pid):
                if time.monotonic() > deadline:
                    pytest.fail(f"{pidfile.name}'s process {pid} did not end", pytrace=False)
                time.sleep(0.05)
            pidfile.unlink(missing_ok=True)

    def restore(self) -> None:
        """Whatever a test did: running and answering again."""
        if self.pid and Path(f"/proc/{self.pid}").exists():
            self.thaw()
            deadline = time.monotonic() + 30
            while not answering() and time.monotonic() < deadline:
                time.sleep(0.2)
        if not answering():
            self.start()


@pytest.fixture
def dockerd(engine):
    if os.getuid() != 0:
        pytest.fail("these tests stop and start dockerd: run them as root, as CI does", pytrace=False)
    controlled = Engine()
    try:
        yield controlled
    finally:
        controlled.restore()


def pytest_collection_modifyitems(config, items):
    """The tests here stop the engine: after every other test, so no other test meets it restarting."""
    ours = [item for item in items if HERE in Path(str(item.fspath)).parents]
    items[:] = [item for item in items if item not in ours] + ours
