"""Which backend a box gets once bubblewrap is one (choice.choose): every backend asked for × whether bwrap holds
the box's policy × whether bwrap is usable here × root or a plain user (with or without a delegated cgroup), the
probes injected and counted; and bwrap's usable line (ways.bwrap_way) as a table."""

import itertools
import os

import pytest

from quinebox.box.backends import choice
from quinebox.box.backends.choice import BWRAP, Choice, choose
from quinebox.box.backends.registry import NAMES
from quinebox.box.backends.rootless import Refusal
from quinebox.box.backends.ways import BWRAP_EXTRA, Way, bwrap_way
from quinebox.errors import ErrorKind, QuineboxError

#: Every name a backend is asked by once bwrap is registered (H2's registry line), whether or not it is yet.
KNOWN = tuple(dict.fromkeys((*NAMES, BWRAP)))
HOST = "--image host (its hidden view needs noexec tmpfs mounts of bounded inodes, which bwrap 0.8 cannot make)"
NO_CGROUP = Refusal("no cgroup is delegated to dev for boxes' limits (hybrid cgroups: systemd delegates none)", "sudo quinebox setup-user dev  (once; again after a restart)")
USERNS = Refusal("unprivileged user namespaces are switched off (kernel.unprivileged_userns_clone = 0)", "sudo sysctl -w kernel.unprivileged_userns_clone=1")


@pytest.fixture(autouse=True)
def no_settings(monkeypatch, tmp_path):
    for name in ("QUINEBOX_BACKEND", "QUINEBOX_RUNTIME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def fine(_name: str) -> None:
    return None


#: Who asks: root, a plain user whose cgroup is delegated, one whose is not (bwrap's probe then says why, with its fix).
WHO = {"root": None, "plain": None, "plain, no cgroup": NO_CGROUP}


def bwrap_answer(usable: bool, who: str) -> str | None:
    """What bwrap's usable probe answers for `who` on a machine where bwrap itself works or not, through the real table."""
    way = bwrap_way(binary="/usr/bin/bwrap", userns=None, extra=True, cgroup=WHO[who], probe=lambda: None if usable else "bwrap could not run a probe box (exit 1): no")
    return None if way.works else f"bwrap {way.what} (fix: {way.fix})"


CASES = list(itertools.product([None, "auto", "oci", "docker", "bwrap"], [None, HOST], [True, False], list(WHO)))


def expected(asked, refused, usable, who):
    """The contract, case by case (the module docstring of choice.py)."""
    if asked == "docker":
        return Choice("docker", None, "the Docker backend was asked for")
    if asked == "bwrap":  # asked by name: never probed, never swapped; a box it cannot hold is refused
        return QuineboxError if refused else Choice("bwrap", None, "the bwrap backend was asked for")
    if asked == "oci":
        return Choice("oci", "runc", "the OCI backend was asked for (runc)")
    if who != "root":  # bwrap as a plain user runs the box as the caller's own id: auto leaves it to runc
        return Choice("oci", "runc", f"boxes run on the OCI runtime runc; not on bwrap, which cannot hold this box: {choice.PLAIN_USER}")
    if refused:
        return Choice("oci", "runc", f"boxes run on the OCI runtime runc; not on bwrap, which cannot hold this box: {HOST}")
    problem = bwrap_answer(usable, who)
    if problem:
        return Choice("oci", "runc", f"boxes run on the OCI runtime runc; not on bwrap, which is faster but not usable here: {problem}")
    return Choice("bwrap", None, "boxes run on bwrap (bubblewrap), the fastest backend that holds this box here")


@pytest.mark.parametrize("asked, refused, usable, who", CASES)
def test_choose(asked, refused, usable, who):
    asked_probe = []

    def bwrap_probe():
        asked_probe.append(1)
        return bwrap_answer(usable, who)

    want = expected(asked, refused, usable, who)
    run = lambda: choose(None, known=KNOWN, backend=asked, bwrap_refused=refused, bwrap_probe=bwrap_probe, probe=fine, plain_user=who != "root")  # noqa: E731
    if want is QuineboxError:
        with pytest.raises(QuineboxError) as caught:
            run()
        assert caught.value.kind == ErrorKind.UNSUPPORTED and (caught.value.fields["backend"], caught.value.fields["why"]) == ("bwrap", HOST)
        assert str(caught.value) == f"refused on bwrap: {HOST}; use --backend oci"
        assert "\n" not in str(caught.value)
    else:
        assert run() == want
    # bwrap's probe is asked only by auto, for root's box that bwrap can hold
    assert len(asked_probe) == (asked in (None, "auto") and not refused and who == "root")


def test_where_bwrap_is_not_usable_auto_is_what_it_was_before_bwrap():
    """bwrap's probe failing leaves auto where it always was: runc where runc runs, else the engine; each says why not bwrap."""
    unusable = lambda: "bwrap is not installed (fix: apt-get install bubblewrap)"  # noqa: E731
    passed = "; not on bwrap, which is faster but not usable here: bwrap is not installed (fix: apt-get install bubblewrap)"
    assert choose(None, known=KNOWN, bwrap_probe=unusable, probe=fine, plain_user=False) == Choice("oci", "runc", f"boxes run on the OCI runtime runc{passed}")
    assert choose(None, known=KNOWN, bwrap_probe=unusable, probe=lambda name: "refused", plain_user=False) == Choice("docker", None, f"boxes run on the Docker engine: refused{passed}")


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_a_runtime_named_keeps_auto_on_that_runtime(runtime):
    assert choose(None, known=KNOWN, runtime=runtime, bwrap_probe=lambda: None, probe=fine) == Choice("oci", runtime, f"boxes run on the OCI runtime {runtime}")


def test_bwrap_passed_over_for_an_engine_box_says_both_reasons():
    got = choose("net:bridge needs the engine", known=KNOWN, bwrap_refused="net:bridge", probe=fine, plain_user=False)
    assert got == Choice("docker", None, "this box runs on the Docker engine: net:bridge needs the engine; not on bwrap, which cannot hold this box: net:bridge")


@pytest.mark.parametrize("how", ["env", "config"])
def test_bwrap_asked_by_the_environment_or_config_yaml(monkeypatch, tmp_path, how):
    if how == "env":
        monkeypatch.setenv("QUINEBOX_BACKEND", "bwrap")
    else:
        (tmp_path / "config" / "quinebox").mkdir(parents=True)
        (tmp_path / "config" / "quinebox" / "config.yaml").write_text("backend: bwrap\n")
    assert choose(None, known=KNOWN, probe=fine) == Choice("bwrap", None, "the bwrap backend was asked for")
    assert choose(None, known=KNOWN, backend="oci", probe=fine).backend == "oci"  # a flag beats both


def test_a_bwrap_choice_is_recorded_and_listed_as_bwrap():
    assert [c.where for c in (Choice("bwrap", None, ""), Choice("oci", "runsc", ""), Choice("oci", None, ""), Choice("docker", None, ""))] == ["bwrap", "runsc", "runc", "docker"]


def test_a_spec_is_judged_by_bwraps_own_refusal():
    from quinebox.box.spec import build_spec

    host = build_spec(["true"], image="host")
    with pytest.raises(QuineboxError) as caught:
        choose(None, known=KNOWN, backend="bwrap", spec=host)
    assert caught.value.kind == ErrorKind.UNSUPPORTED and str(caught.value).startswith("refused on bwrap: --image host")
    assert choose(None, known=KNOWN, backend="bwrap", spec=build_spec(["true"])) == Choice("bwrap", None, "the bwrap backend was asked for")


def unasked():
    raise AssertionError("no probe box when something else already says no")


PROBED = "bwrap could not run a probe box (exit 1): bwrap: setting up uid map: Permission denied"


@pytest.mark.parametrize(
    "binary, userns, extra, cgroup, probe, way",
    [
        ("/usr/bin/bwrap", None, True, None, lambda: None, Way("bwrap", True, "runs boxes here (/usr/bin/bwrap; a hardened probe box ran)")),
        (None, None, True, None, unasked, Way("bwrap", False, "not installed", "apt-get install bubblewrap")),
        (None, USERNS, False, NO_CGROUP, unasked, Way("bwrap", False, "not installed", "apt-get install bubblewrap")),
        ("/usr/bin/bwrap", USERNS, True, None, unasked, Way("bwrap", False, USERNS.reason, USERNS.fix)),
        ("/usr/bin/bwrap", None, False, None, unasked,
         Way("bwrap", False, "the bwrap extra is not installed (pyseccomp: libseccomp's Python API, which compiles a box's seccomp filter)", BWRAP_EXTRA)),
        ("/usr/bin/bwrap", None, True, NO_CGROUP, unasked, Way("bwrap", False, f"not root, and {NO_CGROUP.reason}", NO_CGROUP.fix)),
        ("/usr/bin/bwrap", None, True, None, lambda: PROBED, Way("bwrap", False, PROBED, "use the OCI backend (`--backend oci`)")),
    ],
)
def test_bwrap_way(monkeypatch, binary, userns, extra, cgroup, probe, way):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert bwrap_way(binary=binary, userns=userns, extra=extra, cgroup=cgroup, probe=probe) == way
    assert way.works or way.fix.count("\n") == 0 and way.fix  # one fix, on one line
    assert BWRAP_EXTRA == "pip install 'quinebox[bwrap]'"


def test_a_user_installs_bubblewrap_through_sudo(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert bwrap_way(binary=None, userns=None, extra=True, cgroup=None, probe=unasked).fix == "sudo apt-get install bubblewrap"


@pytest.mark.parametrize(
    "recorded, answer, probes, problem",
    [
        (None, None, 1, None),
        (None, "refused", 1, "refused"),
        ({"problem": None, "at": 0.0}, None, 0, None),  # a pass is kept however old
        ({"problem": "refused", "at": 1000.0 - 60}, None, 0, "refused"),  # a recent failure is kept
        ({"problem": "refused", "at": 1000.0 - 601}, None, 1, None),  # an old one is probed again
        ({"problem": None, "at": 0.0, "binary": "/elsewhere/bwrap:1"}, None, 1, None),  # another binary: probed again
    ],
)
def test_bwraps_probe_box_is_kept_per_binary(tmp_path, monkeypatch, recorded, answer, probes, problem):
    import json

    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    binary = tmp_path / "bwrap"
    binary.write_text("")
    mark = f"{binary}:{os.stat(binary).st_mtime_ns}"
    record = tmp_path / "state" / "bwrap.probe"
    if recorded is not None:
        record.parent.mkdir(parents=True)
        record.write_text(json.dumps({"binary": mark, **recorded}))
    asked = []
    from quinebox.box.backends.probe import bwrap_probed

    assert bwrap_probed(str(binary), run_probe=lambda b: asked.append(b) or answer, now=1000.0) == problem
    assert asked == [str(binary)] * probes
    if probes:
        assert json.loads(record.read_text()) == {"binary": mark, "problem": problem, "at": 1000.0}


def test_the_probe_box_runs_on_this_machines_bwrap():
    """A real bwrap (as root: as an unprivileged id), every namespace, quinebox's seccomp filter compiled by libseccomp."""
    import shutil

    from quinebox.box.backends.probe import probe_bwrap

    binary = shutil.which("bwrap")
    assert binary is not None, "bubblewrap is installed on the machines quinebox is tested on (apt-get install bubblewrap)"
    assert probe_bwrap(binary) is None


@pytest.mark.parametrize("binary, said", [("/bin/false", "bwrap could not run a probe box (exit 1): no reason given"),
                                          ("/nonexistent/bwrap", "cannot run /nonexistent/bwrap: No such file or directory")])
def test_a_probe_box_that_fails_says_why_in_one_line(binary, said):
    from quinebox.box.backends.probe import probe_bwrap

    assert probe_bwrap(binary) == said


@pytest.mark.parametrize("asked", [None, "auto", "bwrap", "oci"])
def test_a_lasting_box_is_bwraps_only_when_asked_for_by_name(asked):
    """A lasting box is entered later (a terminal, another user): auto puts it on runc, saying why, without asking
    bwrap's probe; bwrap asked for by name holds it (its execs by the box's init)."""
    never = lambda: pytest.fail("bwrap probed for a lasting box under auto")  # noqa: E731
    got = choose(None, known=KNOWN, backend=asked, bwrap_refused=None, bwrap_probe=never, probe=fine, lasting=True)
    want = {"bwrap": Choice("bwrap", None, "the bwrap backend was asked for"),
            "oci": Choice("oci", "runc", "the OCI backend was asked for (runc)")}.get(
        asked, Choice("oci", "runc", f"boxes run on the OCI runtime runc; not on bwrap, which cannot hold this box: {choice.LASTING}"))
    assert got == want


def test_a_plain_users_box_is_not_bwraps_under_auto_whatever_bwrap_answers():
    """bwrap as a plain user maps the caller's own id alone: auto leaves a plain user's box to runc, saying why, and
    asks bwrap's probe nothing; root's goes on bwrap."""
    never = lambda: pytest.fail("bwrap probed for a plain user's box under auto")  # noqa: E731
    assert choose(None, known=KNOWN, bwrap_probe=never, probe=fine, plain_user=True) == Choice(
        "oci", "runc", f"boxes run on the OCI runtime runc; not on bwrap, which cannot hold this box: {choice.PLAIN_USER}")
    assert choose(None, known=KNOWN, bwrap_probe=lambda: None, probe=fine, plain_user=False).backend == "bwrap"
