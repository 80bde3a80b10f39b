"""policy.container_config as a table: every safe default, and what each grant changes."""

import json

import pytest

from quinebox.audit.asks import Asks
from quinebox.box.policy import DEFAULT_MEM, DEFAULT_PIDS, GUEST_PREFIX, HOST_SOCKET, LABEL_OWNER, LABEL_PARENT, LABEL_SESSION, LABEL_USER, RUNTIME, container_config, seccomp_profile, workdir_for
from quinebox.box.spec import BoxSpec, ImageInfo, seccomp_base
from quinebox.errors import EXIT_QUINEBOX, GrantError
from quinebox.grants import Grants
from quinebox.worlds.spec import WorldSpec

ARCH = "SCMP_ARCH_X86_64"
#: The agent image as inspect shows it: no environment, /world as its workdir.
AGENT_IMAGE = ImageInfo(name="quinebox/agent:test", id="sha256:agent", workdir="/world")
#: A user's image: its own PATH, LANG and HOME, a workdir, an entrypoint and a command.
USER_IMAGE = ImageInfo(
    name="python:3.12-slim", id="sha256:user", workdir="/app",
    env=(("PATH", "/usr/local/bin:/usr/bin:/bin"), ("LANG", "C.UTF-8"), ("HOME", "/root"), ("PYTHONPATH", "/app")),
    entrypoint=("docker-entrypoint.sh",), cmd=("python3",),
)
RUNTIME_DIR = "/state/runtime/abc"


def spec(*grants: str, cwd: str = "/home/u/proj", workdir: str | None = None, lifeline: str | None = "/state/run/s1.sock", **extra) -> BoxSpec:
    return BoxSpec(
        argv=extra.pop("argv", ("echo", "hi")),
        grants=Grants.parse(grants, cwd=cwd),
        image="quinebox/agent:test",
        session="s1",
        owner="host:42:1000",
        created="2026-01-01T00:00:00+00:00",
        cwd=cwd,
        uid=1000,
        gid=1000,
        workdir=workdir,
        lifeline=lifeline,
        **extra,
    )


def config(*grants: str, image: ImageInfo = AGENT_IMAGE, **kw):
    return container_config(spec(*grants, **kw), image=image, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH)


def seccomp_of(cfg) -> dict:
    [opt] = [o for o in cfg.host["security_opt"] if o.startswith("seccomp=")]
    return json.loads(opt[len("seccomp="):])


@pytest.mark.parametrize(
    "key, value",
    [
        ("network_mode", "none"),
        ("read_only", True),
        ("cap_drop", ["ALL"]),
        ("init", True),
        ("auto_remove", True),
        ("pids_limit", DEFAULT_PIDS),
        ("mem_limit", DEFAULT_MEM),
        ("memswap_limit", DEFAULT_MEM),
        ("ipc_mode", "private"),
        ("log_config", {"type": "none"}),
    ],
)
def test_safe_defaults_without_any_grant(key, value):
    assert config().host[key] == value


def test_defaults_are_never_privileged():
    cfg = config()
    assert "no-new-privileges:true" in cfg.host["security_opt"]
    assert "privileged" not in cfg.host and "cap_add" not in cfg.host
    assert cfg.create["user"] == "1000:1000"
    assert "nano_cpus" not in cfg.host
    assert set(cfg.host["tmpfs"]) == {"/tmp", "/world"}
    assert all("nosuid" in opts and "size=256m" in opts for opts in cfg.host["tmpfs"].values())
    assert "uid=1000,gid=1000" in cfg.host["tmpfs"]["/world"]


def test_environment_holds_only_what_quinebox_sets():
    env = config().create["environment"]
    assert set(env) == {"PATH", "HOME", "TMPDIR", "LANG", "QUINEBOX_SESSION"}


@pytest.mark.parametrize(
    "grant, key, value",
    [
        ("net:bridge", "network_mode", "bridge"),
            ("net", "network_mode", "none"),
            ("net:example.com", "network_mode", "none"),
        ("mem:128m", "mem_limit", 128 << 20),
        ("mem:128m", "memswap_limit", 128 << 20),
        ("pids:32", "pids_limit", 32),
        ("cpus:1.5", "nano_cpus", 1_500_000_000),
        ("cpus:0.25", "nano_cpus", 250_000_000),
    ],
)
def test_grants_map_to_host_config(grant, key, value):
    assert config(grant).host[key] == value


@pytest.mark.parametrize("grants", [("rootfs:rw",), ("rootfs:rw", "tmp:8m"), ("rootfs:rw", "mem:64m")])
def test_the_engine_refuses_a_writable_root_it_cannot_bound_in_one_line(grants):
    """overlay2's container layer is the host's disk: no `tmp:` or memory limit bounds it, so no config is made."""
    with pytest.raises(GrantError) as refused:
        config(*grants)
    said = str(refused.value)
    assert said.startswith("refused rootfs:rw on the Docker engine") and "--backend oci" in said and "\n" not in said
    assert refused.value.exit_code == EXIT_QUINEBOX == 125


def test_tmp_grant_sizes_both_tmpfs():
    assert all("size=64m" in opts for opts in config("tmp:64m").host["tmpfs"].values())


def test_env_grants_are_added_to_the_box_environment():
    env = config("env:A=1", "env:B=").create["environment"]
    assert env["A"] == "1" and env["B"] == ""


def test_mounts_are_bind_mounts_with_the_granted_mode_plus_the_runtime_and_the_host_socket():
    mounts = config("ro:/data", "rw:/src=/work").host["mounts"]
    assert mounts == [
        {"Type": "bind", "Source": "/data", "Target": "/data", "ReadOnly": True, "BindOptions": {"Propagation": "rprivate"}},
        {"Type": "bind", "Source": "/src", "Target": "/work", "ReadOnly": False, "BindOptions": {"Propagation": "rprivate"}},
        {"Type": "bind", "Source": RUNTIME_DIR, "Target": RUNTIME, "ReadOnly": True, "BindOptions": {"Propagation": "rprivate"}},
        {"Type": "bind", "Source": "/state/run/s1.sock", "Target": HOST_SOCKET, "ReadOnly": True},
    ]


def test_without_a_lifeline_there_is_no_socket_mount():
    assert [m["Target"] for m in config(lifeline=None).host["mounts"]] == [RUNTIME]


def test_command_runs_under_the_guest_init_and_labels_say_whose_box_it_is():
    cfg = config()
    assert cfg.create["command"] == [*GUEST_PREFIX, "echo", "hi"]
    assert cfg.create["labels"][LABEL_SESSION] == "s1"
    assert cfg.create["labels"][LABEL_OWNER] == "host:42:1000"
    assert cfg.create["labels"][LABEL_PARENT] == ""
    assert cfg.create["name"] == "quinebox-s1"
    assert cfg.create["stdin_open"] is True


@pytest.mark.parametrize(
    "grants, cwd, workdir, expected",
    [
        ((), "/home/u/proj", None, "/world"),
        (("ro:/home/u/proj",), "/home/u/proj", None, "/home/u/proj"),
        (("ro:/home/u",), "/home/u/proj/sub", None, "/home/u/proj/sub"),
        (("rw:/home/u/proj=/src",), "/home/u/proj/sub", None, "/src/sub"),
        (("ro:/home/u/project",), "/home/u/proj", None, "/world"),
        (("ro:/other", "ro:/home/u=/h"), "/home/u/proj", None, "/h/proj"),
        (("ro:/home/u/proj",), "/home/u/proj", "/tmp", "/tmp"),
    ],
)
def test_workdir_is_the_callers_cwd_when_a_grant_covers_it(grants, cwd, workdir, expected):
    assert workdir_for(spec(*grants, cwd=cwd, workdir=workdir)) == expected


def test_seccomp_allows_only_the_native_architecture():
    assert seccomp_of(config())["architectures"] == [ARCH]
    assert seccomp_of(config())["defaultAction"] == "SCMP_ACT_ERRNO"


def test_syscall_grant_allows_exactly_that_call():
    base = seccomp_of(config())
    relaxed = seccomp_of(config("syscall:clone3", "syscall:ptrace"))
    assert [r for r in relaxed["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and r["names"] == ["clone3", "ptrace"]]
    assert not [r for r in relaxed["syscalls"] if "clone3" in r["names"] and r["action"] == "SCMP_ACT_ERRNO"]
    allowed = lambda p: {n for r in p["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and "args" not in r for n in r["names"]}
    assert allowed(relaxed) - allowed(base) == {"clone3", "ptrace"}


def test_seccomp_profile_leaves_the_base_untouched():
    base = seccomp_base()
    before = json.dumps(base, sort_keys=True)
    seccomp_profile(base, Grants(syscalls=frozenset({"ptrace"})), ARCH)
    assert json.dumps(base, sort_keys=True) == before


def test_an_agent_box_runs_the_agent_loop_directly_it_holds_its_own_lifeline():
    from dataclasses import replace

    from quinebox.box.policy import AGENT_COMMAND

    agent = replace(spec(), argv=(*AGENT_COMMAND, "the mission"), agent=True)
    cfg = container_config(agent, image=AGENT_IMAGE, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH)
    assert cfg.create["command"] == [*AGENT_COMMAND, "the mission"]
    assert cfg.host["mounts"][-1]["Target"] == HOST_SOCKET


def test_without_a_world_the_box_gets_a_scratch_tmpfs_that_keeps_nothing():
    assert config().host["tmpfs"]["/world"].startswith("rw,exec,nosuid,nodev,size=256m")


@pytest.mark.parametrize("kind", ["dir", "bind"])
def test_a_dir_or_bind_world_is_a_read_write_bind_mount_at_world(kind):
    cfg = config(world=WorldSpec(kind=kind, layer="/state/sessions/s1/world/tree"))
    assert "/world" not in cfg.host["tmpfs"]
    assert cfg.host["mounts"][0] == {
        "Type": "bind", "Source": "/state/sessions/s1/world/tree", "Target": "/world", "ReadOnly": False, "BindOptions": {"Propagation": "rprivate"},
    }


def test_an_inherited_world_is_an_overlay_the_engine_mounts_as_an_anonymous_volume():
    world = WorldSpec(kind="overlay", layer="/s/c/upper", work="/s/c/work", lowers=("/s/p/upper", "/s/g/tree"), base=("p", 3))
    mount = config(world=world).host["mounts"][0]
    assert mount["Type"] == "volume" and mount["Target"] == "/world" and "Source" not in mount
    assert mount["VolumeOptions"]["DriverConfig"] == {
        "Name": "local",
        "Options": {"type": "overlay", "device": "overlay", "o": "lowerdir=/s/p/upper:/s/g/tree,upperdir=/s/c/upper,workdir=/s/c/work,userxattr"},
    }
    assert mount["VolumeOptions"]["Labels"] == {LABEL_SESSION: "s1"}


# -- any image -------------------------------------------------------------------------


def test_the_hardening_is_the_same_whatever_the_image():
    ours, theirs = config(image=AGENT_IMAGE), config(image=USER_IMAGE)
    assert ours.host == theirs.host
    for key in ("user", "hostname", "labels", "stdin_open", "tty"):
        assert ours.create[key] == theirs.create[key]


def test_the_guest_runtime_is_mounted_read_only_from_the_state_dir():
    [mount] = [m for m in config().host["mounts"] if m["Target"] == RUNTIME]
    assert mount == {"Type": "bind", "Source": RUNTIME_DIR, "Target": RUNTIME, "ReadOnly": True, "BindOptions": {"Propagation": "rprivate"}}


def test_every_guest_program_starts_through_the_runtimes_own_loader_isolated():
    assert GUEST_PREFIX[:6] == (f"{RUNTIME}/lib/ld.so", "--library-path", f"{RUNTIME}/lib", f"{RUNTIME}/lib/python3", "-I", "-S")


def test_the_box_is_created_from_the_image_id_that_was_inspected():
    assert config(image=USER_IMAGE).create["image"] == "sha256:user"


@pytest.mark.parametrize(
    "argv, image, expected",
    [
        (("echo", "hi"), USER_IMAGE, ["echo", "hi"]),  # a command given replaces the image's
        ((), USER_IMAGE, ["docker-entrypoint.sh", "python3"]),  # none given: entrypoint + command, as docker run
        ((), ImageInfo(name="x", id="i", cmd=("/hello",)), ["/hello"]),
    ],
)
def test_what_the_box_runs(argv, image, expected):
    from dataclasses import replace

    cfg = container_config(replace(spec(), argv=argv), image=image, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH)
    assert cfg.create["command"] == [*GUEST_PREFIX, *expected]


def test_the_images_environment_stands_and_ours_goes_on_top():
    env = config(image=USER_IMAGE).create["environment"]
    assert "PATH" not in env and "LANG" not in env  # the image's own (the engine applies them)
    assert env["HOME"] == "/tmp"  # always writable, whatever the image says
    assert "PYTHONPATH" not in env  # the image's, not repeated here: it reaches the command, never the guest (-I)


def test_an_image_without_path_or_lang_gets_ours():
    env = config(image=AGENT_IMAGE).create["environment"]
    assert env["PATH"].startswith("/usr/local/sbin") and env["LANG"] == "C.UTF-8"


@pytest.mark.parametrize(
    "kw, image, expected",
    [
        ({}, USER_IMAGE, "/app"),  # no grant decides: the image's workdir
        ({}, ImageInfo(name="x", id="i"), "/world"),  # nor the image: /world
        ({"workdir": "/tmp"}, USER_IMAGE, "/tmp"),
    ],
)
def test_workdir_falls_back_to_the_images(kw, image, expected):
    assert config(image=image, **kw).create["working_dir"] == expected


def test_a_grant_covering_the_cwd_decides_the_workdir_before_the_image(tmp_path):
    assert config(f"ro:{tmp_path}", cwd=str(tmp_path), image=USER_IMAGE).create["working_dir"] == str(tmp_path)


def test_tty_and_the_callers_uid_reach_the_container():
    cfg = config(tty=True, caller=4242)
    assert cfg.create["tty"] is True
    assert cfg.create["labels"][LABEL_USER] == "4242"
    assert config().create["tty"] is False


def test_proxied_network_keeps_mode_none_and_names_the_forwarder_for_every_client():
    env = config("net:pypi.org").create["environment"]
    assert config("net:pypi.org").host["network_mode"] == "none"
    assert {env[k] for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")} == {"http://127.0.0.1:3128"}
    assert env["ALL_PROXY"] == env["all_proxy"] == "socks5h://127.0.0.1:3128"
    assert env["QUINEBOX_EGRESS"] == "127.0.0.1:3128" and env["QUINEBOX_NET"] == "net:pypi.org"
    bridged = config("net:bridge").create["environment"]
    assert "HTTP_PROXY" not in bridged and "QUINEBOX_EGRESS" not in bridged and bridged["QUINEBOX_NET"] == "net:bridge"
    assert "QUINEBOX_NET" not in config().create["environment"]


def test_a_secret_is_a_placeholder_in_the_box_and_its_trust_is_mounted_read_only():
    cfg = config("net:api.example.com", "secret:TOKEN@api.example.com", tls_dir="/state/run/s1.tls")
    env = cfg.create["environment"]
    assert env["TOKEN"] == "quinebox-secret-TOKEN-s1"
    assert {env[k] for k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT", "AWS_CA_BUNDLE")} == {"/run/quinebox/tls/bundle.pem"}
    assert env["NODE_EXTRA_CA_CERTS"] == "/run/quinebox/tls/ca.pem"
    [mount] = [m for m in cfg.host["mounts"] if m["Target"] == "/run/quinebox/tls"]
    assert (mount["Source"], mount["ReadOnly"]) == ("/state/run/s1.tls", True)


def test_net_rules_a_person_may_approve_put_the_box_behind_the_proxy_and_are_named_to_it():
    asks = Asks.parse(["net:*.example.com", "spawn:2"], ["net:10.0.0.0/8"], cwd="/")
    cfg = config(asks=asks, egress_socket="/state/run/s1.egress")
    env = cfg.create["environment"]
    assert cfg.host["network_mode"] == "none"
    assert env["HTTP_PROXY"] == "http://127.0.0.1:3128" and "QUINEBOX_NET" not in env
    assert env["QUINEBOX_ASK"] == "net:*.example.com spawn:2"
    assert [m["Source"] for m in cfg.host["mounts"] if m["Target"] == "/run/quinebox/egress.sock"] == ["/state/run/s1.egress"]
    only_deny = config(asks=Asks.parse((), ["net:10.0.0.0/8"], cwd="/")).create["environment"]
    assert "HTTP_PROXY" not in only_deny and "QUINEBOX_ASK" not in only_deny
    assert "HTTP_PROXY" not in config("net:bridge", asks=asks).create["environment"]


@pytest.mark.parametrize(
    "tags, expected",
    [
        ((), {}),
        ((("attempt", "2"), ("input", "doc.txt"), ("run", "ab12")), {"io.quinebox.attempt": "2", "io.quinebox.input": "doc.txt", "io.quinebox.run": "ab12"}),
    ],
)
def test_a_callers_tags_become_labels_beside_quineboxs_own(tags, expected):
    labels = config(tags=tags).create["labels"]
    assert {k: v for k, v in labels.items() if k.rsplit(".", 1)[1] in ("run", "input", "attempt")} == expected
    assert labels[LABEL_SESSION] == "s1" and labels[LABEL_OWNER] == "host:42:1000"


@pytest.mark.parametrize("tags", [{"session": "x"}, {"owner": "h:1:2"}, {"run": "r", "pool": "1"}, {"anything": "y"}])
def test_tags_cannot_name_quineboxs_own_labels(tags):
    from quinebox.box.spec import build_spec
    from quinebox.errors import GrantError

    with pytest.raises(GrantError, match="a caller may set only run, input, attempt"):
        build_spec(["true"], tags=tags)
