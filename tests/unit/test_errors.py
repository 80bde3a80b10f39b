"""quinebox's errors as data: each has a kind (its class's, unless its raiser says one), fields and its cause."""

import pickle

import pytest

from quinebox.errors import EXIT_QUINEBOX, EngineError, ErrorKind, GrantError, ImageError, QuineboxError, StateError
from quinebox.tree.prune import RulesError
from quinebox.tree.retention import RetentionError
from quinebox.worlds.revisions import ConflictError, WorldError

DEFAULTS = [
    (QuineboxError, ErrorKind.FAILED, EXIT_QUINEBOX),
    (GrantError, ErrorKind.BAD_GRANT, EXIT_QUINEBOX),
    (EngineError, ErrorKind.UNREACHABLE, EXIT_QUINEBOX),
    (ImageError, ErrorKind.FAILED, EXIT_QUINEBOX),
    (StateError, ErrorKind.STORAGE, EXIT_QUINEBOX),
    (WorldError, ErrorKind.FAILED, EXIT_QUINEBOX),
    (ConflictError, ErrorKind.CONFLICT, 1),
    (RulesError, ErrorKind.BAD_INPUT, 2),
    (RetentionError, ErrorKind.BAD_INPUT, 2),
]


@pytest.mark.parametrize(("cls", "kind", "exit_code"), DEFAULTS, ids=[c.__name__ for c, _, _ in DEFAULTS])
def test_a_message_alone_keeps_working_with_its_class_kind(cls, kind, exit_code):
    exc = cls("what is wrong: how to fix it")
    assert (str(exc), exc.kind, dict(exc.fields), exc.exit_code) == ("what is wrong: how to fix it", kind, {}, exit_code)
    assert isinstance(exc, QuineboxError)


@pytest.mark.parametrize("kind", list(ErrorKind))
@pytest.mark.parametrize("cls", [c for c, _, _ in DEFAULTS], ids=[c.__name__ for c, _, _ in DEFAULTS])
def test_the_raiser_s_kind_wins_and_the_fields_are_attributes(cls, kind):
    exc = cls("message", kind=kind, box="b1", size=3)
    assert exc.kind is kind
    assert dict(exc.fields) == {"box": "b1", "size": 3}
    assert (exc.box, exc.size) == ("b1", 3)
    assert exc.data() == {"kind": kind.value, "message": "message", "fields": {"box": "b1", "size": 3}}


def test_a_kind_given_as_its_value_is_the_kind():
    assert QuineboxError("m", kind="not_found").kind is ErrorKind.NOT_FOUND
    with pytest.raises(ValueError):
        QuineboxError("m", kind="no such kind")


@pytest.mark.parametrize("name", ["exit_code", "fields", "args", "default_kind", "with_traceback", "cause", "data"])
def test_a_field_may_not_shadow_what_the_error_is(name):
    with pytest.raises(TypeError, match=name):
        QuineboxError("m", **{name: 1})


def test_fields_cannot_be_changed_through_the_mapping():
    exc = QuineboxError("m", box="b1")
    with pytest.raises(TypeError):
        exc.fields["box"] = "b2"  # type: ignore[index]


def test_a_grant_error_is_still_a_value_error():
    with pytest.raises(ValueError):
        raise GrantError("bad grant 'x'")


def test_the_cause_is_kept_with_from_and_with_from_none():
    def raising(suppress: bool):
        try:
            raise OSError(28, "No space left on device")
        except OSError as exc:
            if suppress:
                raise StateError("cannot write the tape") from None
            raise StateError("cannot write the tape") from exc

    for suppress in (False, True):
        with pytest.raises(StateError) as caught:
            raising(suppress)
        assert isinstance(caught.value.cause, OSError) and caught.value.cause.errno == 28
        assert (caught.value.__cause__ is None) is suppress


def test_no_cause_is_none():
    assert QuineboxError("m").cause is None


@pytest.mark.parametrize("cls", [c for c, _, _ in DEFAULTS], ids=[c.__name__ for c, _, _ in DEFAULTS])
def test_an_error_pickles_whole(cls):
    exc = pickle.loads(pickle.dumps(cls("message", kind=ErrorKind.TIMEOUT, box="b1")))
    assert (type(exc), str(exc), exc.kind, dict(exc.fields), exc.box) == (cls, "message", ErrorKind.TIMEOUT, {"box": "b1"}, "b1")
    plain = pickle.loads(pickle.dumps(cls("message")))
    assert (plain.kind, dict(plain.fields)) == (cls.default_kind, {})


def test_every_kind_has_a_distinct_lowercase_value():
    values = [kind.value for kind in ErrorKind]
    assert len(set(values)) == len(values) and all(v == v.lower() for v in values)
    assert {"not_found", "unreachable", "refused", "bad_grant", "bad_input", "limit", "timeout", "conflict"} <= set(values)
