"""configure.py decides by an error's kind: only an engine that cannot be reached (or did not answer in time) sends it
to what root shared or to a registry; an engine that answered and refused is reported as itself, never as "no engine".

The engine's side is a stand-in here: what it raises is the point's input, and a real engine's refusal of an image
request cannot be had on demand. What configure does with each is real."""

import pytest

from quinebox.box import configure
from quinebox.box.backends.docker.engine import DockerBackend
from quinebox.errors import EngineError, ErrorKind, ImageError

ABSENT = "quinebox/absent:h4-configure"


class Engine:
    def __init__(self, error: EngineError):
        self.error = error

    def inspect_image(self, name):
        raise self.error


@pytest.mark.parametrize(
    ("kind", "raised", "said_kind"),
    [
        (ErrorKind.UNREACHABLE, ImageError, ErrorKind.NOT_FOUND),  # no engine: --pull never, so the image is not here
        (ErrorKind.TIMEOUT, ImageError, ErrorKind.NOT_FOUND),
        (ErrorKind.REFUSED, EngineError, ErrorKind.REFUSED),  # the engine answered: its refusal is the error
        (ErrorKind.FAILED, EngineError, ErrorKind.FAILED),
        (ErrorKind.BAD_INPUT, EngineError, ErrorKind.BAD_INPUT),
    ],
)
def test_only_an_engine_that_cannot_be_asked_falls_back(monkeypatch, kind, raised, said_kind):
    engine_error = EngineError("the engine says so", kind=kind)
    monkeypatch.setattr(DockerBackend, "shared", classmethod(lambda cls: Engine(engine_error)))
    with pytest.raises(raised) as caught:
        configure.unpacked_image(ABSENT, pull="never")
    assert caught.value.kind is said_kind
    if raised is ImageError:
        assert dict(caught.value.fields) == {"image": ABSENT}
        assert caught.value.__cause__ is engine_error  # --traceback shows why the engine could not be asked
    else:
        assert caught.value is engine_error
