"""Following a box's events on the engine: the engine's errors are incidents, a bug of ours is not."""

import pytest
import urllib3.exceptions

from quinebox.box.backends import watch
from quinebox.box.backends.docker import launch as docker_launch
from quinebox.box.backends.docker.launch import DockerLaunch
from quinebox.box.run.ending import Ends, How
from quinebox.errors import EngineError


class Engine:
    """A backend that answers pings (or not) and notes kills and removals."""

    def __init__(self, answers: bool = True):
        self.answers = answers
        self.done: list[tuple[str, str]] = []

    def ping(self) -> None:
        if not self.answers:
            raise EngineError("cannot reach the Docker engine")

    def kill(self, container: str) -> bool:
        self.done.append(("kill", container))
        return True

    def remove(self, container: str) -> bool:
        self.done.append(("remove", container))
        return True


@pytest.fixture
def incidents(monkeypatch):
    told: list[str] = []
    monkeypatch.setattr(watch, "record_incident", lambda what, **facts: told.append(what))
    monkeypatch.setattr(watch, "SHUTDOWN_GRACE", 0.1)
    return told


def following(events, engine: Engine) -> tuple[DockerLaunch, Ends, list[bytes]]:
    ends = Ends()
    launch = DockerLaunch(engine, ends, session="s1", reader_gone=lambda: None)  # type: ignore[arg-type]
    said: list[bytes] = []
    launch.id, launch.say, launch._events = "c1", said.append, events
    return launch, ends, said


def die(code: int) -> dict:
    return {"Action": "die", "Actor": {"Attributes": {"exitCode": str(code)}}}


def test_die_and_destroy_end_the_box_with_its_status(incidents):
    launch, ends, _ = following(iter([{"Action": "oom"}, die(137), {"Action": "destroy"}]), Engine())
    launch._follow_events()
    assert ends.gone.is_set() and ends.settle().how is How.OOM and ends.settle().code == 137
    assert incidents == []


def test_a_stream_the_engine_broke_before_the_box_died_is_an_engine_incident(incidents):
    def broken():
        yield {"Action": "start"}
        raise urllib3.exceptions.ProtocolError("Connection broken")

    launch, ends, _ = following(broken(), Engine(answers=False))
    launch._follow_events()
    ending = ends.settle()
    assert (ending.how, ending.code) == (How.ENGINE_LOST, 125) and "went away" in ending.termination
    assert incidents == ["box s1 given up: its event stream ended before it did"]


def test_a_bug_while_following_ends_the_box_as_an_internal_error_never_an_incident(incidents):
    engine = Engine()
    launch, ends, said = following(iter([{"Action": "start"}, None]), engine)  # None.get: a bug of ours
    with pytest.raises(AttributeError):
        launch._follow_events()
    ending = ends.settle()
    assert (ending.how, ending.code) == (How.INTERNAL_ERROR, 125) and "internal error" in ending.termination
    assert incidents == [] and engine.done == [("kill", "c1"), ("remove", "c1")]
    assert ends.gone.is_set() and said and b"AttributeError" in said[0]


def test_a_stream_we_closed_ends_quietly_however_it_ends(incidents):
    launch, ends, _ = following(iter([None]), Engine(answers=False))
    launch._closed = True
    launch._follow_events()
    assert ends.gone.is_set() and ends.settle().how is How.SIGNALLED and incidents == []


def test_the_stream_errors_are_the_engine_clients_own():
    assert OSError in docker_launch.ENGINE_STREAM_ERRORS and Exception not in docker_launch.ENGINE_STREAM_ERRORS
