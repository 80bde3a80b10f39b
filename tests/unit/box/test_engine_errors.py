"""What the engine's thin layer turns into quinebox's errors, and what it leaves alone: against a real socket
that accepts and never answers (a wedged engine) and one nobody listens on, no engine needed."""

import socket
import threading

import docker
import pytest

from quinebox.box.backends.docker.engine import DockerBackend
from quinebox.box.policy import ContainerConfig
from quinebox.errors import EngineError


@pytest.fixture
def wedged(tmp_path):
    """A Unix socket that accepts connections and never says a word, as a wedged engine does."""
    path = str(tmp_path / "wedged.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"unix://{path}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def engine_at(url: str, timeout: float = 0.3) -> DockerBackend:
    return DockerBackend(docker.APIClient(base_url=url, version="1.41", timeout=timeout))


def test_a_deadline_is_told_by_its_type_not_its_words(wedged):
    with pytest.raises(EngineError, match="did not answer a ping in time"):
        engine_at(wedged).ping()
    with pytest.raises(EngineError, match="did not answer the request to list boxes in time"):
        engine_at(wedged).containers()


def test_an_engine_nobody_listens_for_is_unreachable_and_quiet_calls_say_false(tmp_path):
    engine = engine_at(f"unix://{tmp_path / 'nobody.sock'}")
    with pytest.raises(EngineError, match="cannot reach the Docker engine"):
        engine.ping()
    assert (engine.kill("x"), engine.remove("x"), engine.exec_pid("x")) == (False, False, None)


def test_a_bug_in_building_a_request_is_a_bug_not_an_engine_failure(tmp_path):
    engine = engine_at(f"unix://{tmp_path / 'nobody.sock'}")
    with pytest.raises(TypeError):
        engine.create(ContainerConfig(create={"image": "x"}, host={"no_such_option": 1}))


@pytest.mark.parametrize(
    "call, raised",
    [
        # docker-py's own refusal of an argument of ours (plain DockerException, from create_host_config's parse_bytes)
        (lambda engine: engine.create(ContainerConfig(create={"image": "x"}, host={"mem_limit": "bogus"})), docker.errors.DockerException),
        # no id given: docker-py's NullResource, a ValueError of its own, before any request
        (lambda engine: engine.kill(None), docker.errors.NullResource),
        (lambda engine: engine.remove(None), docker.errors.NullResource),
    ],
    ids=["DockerException from create_host_config", "NullResource from kill", "NullResource from remove"],
)
def test_docker_pys_own_argument_errors_reach_the_user_as_themselves(tmp_path, call, raised):
    """A bug in quinebox's use of docker-py is never "cannot reach the Docker engine" (nor a quiet False): the
    engine is not even asked, so it is not what failed."""
    engine = engine_at(f"unix://{tmp_path / 'nobody.sock'}")
    with pytest.raises(raised) as caught:
        call(engine)
    assert not isinstance(caught.value, EngineError)


def test_an_engine_nobody_listens_for_is_unreachable_on_connect_too(tmp_path, monkeypatch):
    """docker-py says a failed version round trip as a plain DockerException: on connect it is the engine's failure."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'nobody.sock'}")
    with pytest.raises(EngineError, match="^cannot reach the Docker engine"):
        DockerBackend.connect(timeout=0.3)
