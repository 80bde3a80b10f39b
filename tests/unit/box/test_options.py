"""BoxOptions: the one description of a box; its defaults, how it is derived, what it refuses, and how it becomes a spec."""

import dataclasses

import pytest

import quinebox
from quinebox.box.options import BoxOptions
from quinebox.box.spec import DEFAULT_IMAGE, build_spec
from quinebox.errors import GrantError


def test_the_package_exports_it():
    assert quinebox.BoxOptions is BoxOptions


@pytest.mark.parametrize(
    "name, default",
    [
        ("grants", ()), ("policy", None), ("timeout", None), ("image", None), ("pull", "missing"), ("workdir", None),
        ("world", None), ("world_from", None), ("world_tar", None), ("world_at", None), ("ask", ()), ("deny", ()),
        ("ask_timeout", None), ("backend", None), ("runtime", None), ("tags", ()),
    ],
)
def test_defaults(name, default):
    assert getattr(BoxOptions(), name) == default


def test_the_option_names_are_the_fields_and_nothing_else():
    assert set(BoxOptions.names()) == {f.name for f in dataclasses.fields(BoxOptions)}
    assert {"tty", "stdin", "model", "input", "check"}.isdisjoint(BoxOptions.names())  # streams and agents are not the box's


@pytest.mark.parametrize(
    "given, field, value",
    [
        ({"grants": ["mem:64m", "net"]}, "grants", ("mem:64m", "net")),
        ({"ask": iter(["net:*"])}, "ask", ("net:*",)),
        ({"deny": []}, "deny", ()),
        ({"world_from": ["a", "b"]}, "world_from", ("a", "b")),
        ({"world_from": []}, "world_from", None),  # the CLI's empty --world-from: no world from paths
        ({"world_from": "empty"}, "world_from", "empty"),
        ({"tags": {"run": "r", "input": "3"}}, "tags", (("input", "3"), ("run", "r"))),
    ],
)
def test_values_are_normalised_to_immutable_ones(given, field, value):
    assert getattr(BoxOptions(**given), field) == value


def test_it_is_frozen_and_hashable():
    options = BoxOptions(grants=["mem:64m"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.grants = ("net",)  # type: ignore[misc]
    assert hash(options) == hash(BoxOptions(grants=("mem:64m",)))


def test_replace_and_of_derive_new_options_and_leave_the_old():
    base = BoxOptions(image="alpine", grants=["mem:64m"])
    for derived in (dataclasses.replace(base, backend="oci"), BoxOptions.of(base, backend="oci")):
        assert (derived.image, derived.grants, derived.backend) == ("alpine", ("mem:64m",), "oci")
    assert base.backend is None
    assert BoxOptions.of() == BoxOptions()


def test_given_is_what_differs_from_the_defaults():
    assert BoxOptions().given() == {}
    assert BoxOptions(grants=["net"], pull="never", backend="oci").given() == {"grants": ("net",), "pull": "never", "backend": "oci"}
    assert BoxOptions(**BoxOptions(image="alpine", tags={"run": "r"}).given()) == BoxOptions(image="alpine", tags={"run": "r"})


@pytest.mark.parametrize(
    "name, words",
    [
        ("grant", "unknown box option 'grant' (did you mean 'grants'?): a box's options are grants, policy,"),
        ("tty", "unknown box option 'tty'"),
        ("model", "unknown box option 'model'"),
        ("xyzzy", "unknown box option 'xyzzy': a box's options are"),
    ],
)
def test_an_unknown_option_is_a_type_error_naming_it_and_the_known_ones(name, words):
    with pytest.raises(TypeError) as raised:
        BoxOptions.of(**{name: True})
    assert str(raised.value).startswith(words) and "\n" not in str(raised.value)
    assert "backend" in str(raised.value)
    with pytest.raises(TypeError, match=name):
        BoxOptions.of(BoxOptions(), **{name: True})
    with pytest.raises(TypeError, match=name):
        BoxOptions(**{name: True})  # the constructor and dataclasses.replace refuse it too
    with pytest.raises(TypeError, match=name):
        dataclasses.replace(BoxOptions(), **{name: True})


@pytest.mark.parametrize("name", ["grants", "ask", "deny"])
def test_one_bare_grant_string_is_refused_not_read_letter_by_letter(name):
    with pytest.raises(TypeError, match=rf"box option {name} is a list of grant strings"):
        BoxOptions(**{name: "mem:64m"})


@pytest.mark.parametrize(
    "options, spec_fields",
    [
        (BoxOptions(), {"image": DEFAULT_IMAGE, "pull": "missing", "workdir": None, "backend": None, "runtime": None, "tags": ()}),
        (BoxOptions(image="alpine", pull="never", workdir="/w"), {"image": "alpine", "pull": "never", "workdir": "/w"}),
        (BoxOptions(backend="oci", runtime="runsc"), {"backend": "oci", "runtime": "runsc"}),
        (BoxOptions(backend="docker"), {"backend": "docker", "runtime": None}),
        (BoxOptions(tags={"run": "r1"}), {"tags": (("run", "r1"),)}),
    ],
)
def test_how_options_render_into_a_spec(tmp_path, options, spec_fields):
    spec = build_spec(["true"], options, cwd=str(tmp_path))
    assert {name: getattr(spec, name) for name in spec_fields} == spec_fields


def test_grants_rules_and_timeout_render_into_the_specs_grants_and_asks(tmp_path):
    spec = build_spec(["true"], BoxOptions(grants=["mem:64m"], timeout="5m", ask=["net:*.example.com"], deny=["net:evil.example"], ask_timeout="0"), cwd=str(tmp_path))
    assert (spec.grants.mem, spec.grants.time) == (64 << 20, 300.0)
    assert (spec.asks.ask.format(), spec.asks.deny.format(), spec.asks.timeout) == (["net:*.example.com"], ["net:evil.example"], 0.0)


def test_options_by_name_and_options_given_whole_make_the_same_spec(tmp_path):
    by_name = build_spec(["true"], cwd=str(tmp_path), grants=["mem:64m"], image="alpine")
    whole = build_spec(["true"], BoxOptions(grants=["mem:64m"], image="alpine"), cwd=str(tmp_path))
    keep = ("argv", "grants", "image", "pull", "workdir", "asks", "backend", "runtime", "tags")
    assert [getattr(by_name, k) for k in keep] == [getattr(whole, k) for k in keep]
    with pytest.raises(TypeError, match="unknown box option 'grant'"):
        build_spec(["true"], cwd=str(tmp_path), grant=["mem:64m"])


@pytest.mark.parametrize(
    "options, words",
    [
        (BoxOptions(pull="sometimes"), "bad --pull 'sometimes'"),
        (BoxOptions(workdir="rel"), "bad workdir 'rel'"),
        (BoxOptions(tags={"owner": "me"}), "bad box labels"),
        (BoxOptions(world="/x", world_tar="/y"), "give one of --world"),
    ],
)
def test_values_are_checked_when_the_spec_is_built(tmp_path, options, words):
    with pytest.raises(GrantError, match=words):
        build_spec(["true"], options, cwd=str(tmp_path))
