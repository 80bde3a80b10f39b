"""The Python API's names and options, where no box need start: what is refused before one would, the names of
one release ago (warned, still working), and `check=`'s error."""

import subprocess
import warnings

import pytest

import quinebox
from quinebox.api import ExecResult, Runner, resume_session
from quinebox.errors import QuineboxError


@pytest.mark.parametrize(
    "old, new, words",
    [
        ("Box", Runner, "quinebox.Box is now quinebox.Runner"),
        ("resume", resume_session, "quinebox.resume is now quinebox.resume_session"),
    ],
)
def test_an_old_name_still_works_for_one_release_with_a_deprecation_warning(old, new, words):
    with pytest.warns(DeprecationWarning, match=words) as caught:
        assert getattr(quinebox, old) is new
    assert caught[0].filename == __file__  # stacklevel: the warning points at the caller's line
    with pytest.warns(DeprecationWarning, match=words):
        assert getattr(quinebox.api, old) is new
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(quinebox, new.__name__) is new  # the new name warns of nothing
    assert old not in quinebox.__all__ and new.__name__ in quinebox.__all__


def test_exec_result_says_args_as_subprocess_does_and_argv_is_a_deprecated_alias():
    result = ExecResult(args=("sh", "-c", "x"), returncode=0, stdout=b"", stderr=b"", timed_out=False, oom_killed=False, session="s", duration_s=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert result.args == ("sh", "-c", "x")
    with pytest.warns(DeprecationWarning, match=r"ExecResult.argv is deprecated: use .args"):
        assert result.argv == ("sh", "-c", "x")


@pytest.mark.parametrize("code", [1, 124, 125])
def test_check_returncode_raises_called_process_error_with_the_commands_outputs(code):
    result = ExecResult(args=("false",), returncode=code, stdout=b"out", stderr=b"err", timed_out=code == 124, oom_killed=False, session="s", duration_s=0.0)
    with pytest.raises(subprocess.CalledProcessError) as raised:
        result.check_returncode()
    assert (raised.value.returncode, raised.value.cmd, raised.value.output, raised.value.stdout, raised.value.stderr) == (code, ("false",), b"out", b"out", b"err")


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: quinebox.exec(["true"], grant=["mem:64m"]), "unknown box option 'grant' (did you mean 'grants'?)"),
        (lambda: quinebox.exec(["true"], tty=True), "unknown box option 'tty'"),
        (lambda: quinebox.exec(["true"], quinebox.BoxOptions(), imgae="alpine"), "unknown box option 'imgae' (did you mean 'image'?)"),
        (lambda: quinebox.Popen(["true"], grant=["mem:64m"]), "unknown box option 'grant'"),
        (lambda: quinebox.run("m", grant=["mem:64m"]), "unknown box option 'grant'"),
        (lambda: Runner(grant=["mem:64m"]), "unknown box option 'grant'"),
        (lambda: Runner().exec(["true"], tty=True), "unknown box option 'tty'"),  # dropped in silence before
        (lambda: Runner().exec(["true"], grant=["net"]), "unknown box option 'grant'"),
        (lambda: Runner().exec(["true"], model="m"), "unknown box option 'model'"),  # exec runs no agent
        (lambda: Runner().run("m", grant=["net"]), "unknown box option 'grant'"),
        (lambda: Runner(cluster="ray://nowhere:1").run("m", grant=["net"]), "unknown box option 'grant'"),
    ],
)
def test_an_unknown_option_is_refused_before_any_box_starts(call, words):
    with pytest.raises(TypeError) as raised:
        call()
    assert str(raised.value).startswith(words) and "a box's options are grants, policy" in str(raised.value)


def test_a_runners_defaults_are_one_box_options_and_a_calls_grants_add_to_theirs():
    runner = Runner(quinebox.BoxOptions(image="alpine"), grants=["mem:64m"], model="script:x.yaml", max_turns=3)
    assert runner.options == quinebox.BoxOptions(image="alpine", grants=("mem:64m",))
    box, agent = runner._split({"grants": ["net"], "timeout": "5m", "max_turns": 9})
    assert box == quinebox.BoxOptions(image="alpine", grants=("mem:64m", "net"), timeout="5m")
    assert agent == {"model": "script:x.yaml", "max_turns": 9, "max_tokens": None}


@pytest.mark.parametrize("option", [{"policy": "strict"}, {"workdir": "/w"}, {"world": "/tmp"}, {"backend": "oci"}, {"runtime": "runsc"}])
def test_what_cannot_go_to_a_clusters_nodes_is_refused_before_connecting(option):
    [(name, _)] = option.items()
    with pytest.raises(QuineboxError, match=rf"^{name} cannot go to a cluster's nodes: drop them, or run without cluster="):
        Runner(cluster="ray://nowhere.invalid:1", **option).run("m")
