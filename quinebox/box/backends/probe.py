"""Whether an OCI runtime can run a hardened box on this machine: one tiny box, tried once and remembered.

The probe asks for what every box asks for — new namespaces, a memory and pids cgroup, no capabilities,
NoNewPrivs, a seccomp filter, a read-only root, a non-root user — so a runtime that refuses this machine
(crun under a hybrid cgroup hierarchy, a runsc platform the kernel lacks) is found here and not by a user's box.
Its root is an empty directory with the host's /usr bound read-only (and /bin, /lib… as the host has them:
directories bound, merged-/usr links copied), running /bin/true.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quinebox.box.backends.oci.box import hold, release
from quinebox.box.backends.oci.policy import Rootless, rootless_linux
from quinebox.box.backends.oci.runtime import Runtime, runtime_timeout
from quinebox.state import state_dir

_BINDS = ("/usr", "/bin", "/lib", "/lib64", "/sbin")
#: A runtime (or bwrap) that failed its probe is probed again after this long: one may fail a box under load and run the next.
PROBE_RETRY = 600.0


def probe_config(rootfs: str, cgroup: str, rootless: Rootless | None = None) -> dict[str, Any]:
    """The probe's config.json; `rootless`: as a user who is not root makes it (oci.policy.Rootless), its user
    the namespace's uid 0 and its cgroup the user's."""
    mounts = [{"destination": "/proc", "type": "proc", "source": "proc"},
              {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}]
    mounts += [{"destination": path, "type": "bind", "source": os.path.realpath(path), "options": ["rbind", "ro", "rprivate"]}
               for path in _BINDS if os.path.isdir(path) and not os.path.islink(path)]
    config: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {"args": ["/bin/true"], "cwd": "/", "env": ["PATH=/usr/bin:/bin"], "user": {"uid": 0 if rootless else 1000, "gid": 0 if rootless else 1000},
                    "noNewPrivileges": True, "capabilities": {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")}},
        "root": {"path": rootfs, "readonly": True},
        "hostname": "probe",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")],
            "resources": {"memory": {"limit": 64 << 20, "swap": 64 << 20}, "pids": {"limit": 128}},
            "cgroupsPath": cgroup,
            "seccomp": {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [], "syscalls": [{"names": ["ptrace"], "action": "SCMP_ACT_ERRNO"}]},
        },
    }
    if rootless is not None:
        config["linux"] = rootless_linux(config["linux"], rootless, cgroup.lstrip("/"))
    return config


def probe_runtime(runtime: Runtime, rootless: Rootless | None = None) -> str | None:
    """None when a hardened box ran to exit 0 on `runtime`, else the runtime's own reason, in one line."""
    with tempfile.TemporaryDirectory(prefix="quinebox-probe-") as bundle:
        rootfs = os.path.join(bundle, "rootfs")
        os.mkdir(rootfs)
        for path in _BINDS:  # mount points in a root that is read-only once the runtime has it
            if os.path.isdir(path) and not os.path.islink(path):
                os.mkdir(os.path.join(rootfs, path.lstrip("/")))
            elif os.path.islink(path):
                os.symlink(os.readlink(path), os.path.join(rootfs, path.lstrip("/")))
        os.mkdir(os.path.join(rootfs, "proc"))
        os.mkdir(os.path.join(rootfs, "dev"))
        cid = f"quinebox-probe-{os.getpid()}-{os.urandom(3).hex()}"  # two processes of one pid namespace never share one
        config = probe_config(rootfs, f"/{cid}", rootless)
        with open(os.path.join(bundle, "config.json"), "w") as out:
            json.dump(config, out)
        runtime.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        # As any box: the keeper removes it if this process dies meanwhile, and the terminal's Ctrl-C, meant for
        # this process, never reaches the runtime mid-create (which would leave its init waiting in a cgroup).
        hold(runtime, cid, bundle)
        try:
            done = subprocess.run(runtime.argv("run", "--bundle", bundle, cid), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=runtime_timeout(), start_new_session=True)
        except subprocess.TimeoutExpired:
            return f"{runtime.name} did not run a probe box in {runtime_timeout():g} s"
        except OSError as exc:
            return f"cannot run {runtime.binary}: {exc.strerror}"
        finally:
            runtime.delete(cid)
            release(cid)
            _rmdir_cgroups(config["linux"]["cgroupsPath"])
        if done.returncode != 0:
            lines = [line.strip() for line in done.stderr.decode(errors="replace").splitlines() if line.strip()]
            return f"{runtime.name} could not run a probe box (exit {done.returncode}): {lines[-1] if lines else 'no reason given'}"
    return None


def _rmdir_cgroups(path: str) -> None:
    """The probe's cgroup in every hierarchy, should the runtime have left it (runsc does, when it fails)."""
    for group in (*Path("/sys/fs/cgroup").glob(f"*/{path.strip('/')}"), Path("/sys/fs/cgroup", path.strip("/"))):
        try:
            group.rmdir()
        except OSError:
            pass  # not there, or not empty: gc's sweep takes it once it is


#: The probe's seccomp profile: one rule, so libseccomp (the `bwrap` extra) compiles a real filter that bwrap loads.
BWRAP_PROBE_PROFILE = {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [], "syscalls": [{"names": ["ptrace"], "action": "SCMP_ACT_ERRNO"}]}
#: The unprivileged host id root runs the probe as (nobody's): bwrap never runs a box as host root.
PROBE_ID = 65534
#: How long a probe box may take: bwrap starts one in ~10 ms.
BWRAP_PROBE_TIMEOUT = 20.0


def probe_bwrap(binary: str) -> str | None:
    """None when bubblewrap at `binary` ran a hardened box to exit 0 (every namespace, a user namespace of its own, no
    capabilities, quinebox's seccomp filter compiled by libseccomp, the host's /usr read-only), run as this user or, as
    root, as an unprivileged id; else its reason in one line."""
    from quinebox.box.backends.bwrap.policy import compile_seccomp

    argv = [binary, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--uid", "1000", "--gid", "1000"]
    for path in _BINDS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", os.path.realpath(path), path]
    program = os.memfd_create("quinebox-probe-seccomp")
    try:
        os.write(program, compile_seccomp(BWRAP_PROBE_PROFILE))
        os.lseek(program, 0, os.SEEK_SET)
        argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/", "--seccomp", str(program), "--", "/bin/true"]
        root = os.geteuid() == 0
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=BWRAP_PROBE_TIMEOUT, pass_fds=(program,),
                              start_new_session=True, cwd="/", user=PROBE_ID if root else None, group=PROBE_ID if root else None, extra_groups=[] if root else None)
    except subprocess.TimeoutExpired:
        return f"bwrap did not run a probe box in {BWRAP_PROBE_TIMEOUT:g} s"
    except OSError as exc:
        return f"cannot run {binary}: {exc.strerror}"
    finally:
        os.close(program)
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.decode(errors="replace").splitlines() if line.strip()]
        return f"bwrap could not run a probe box (exit {done.returncode}): {lines[-1] if lines else 'no reason given'}"
    return None


def kept(record: Path, binary: str, probe: Callable[[], str | None], *, now: float | None = None) -> str | None:
    """A probe's answer for the backend binary at `binary`, kept in `record`: a pass until the binary changes (its
    mtime), a failure for PROBE_RETRY seconds; `probe()` runs only when nothing kept answers. A record that cannot be
    read or written is no answer (probed again), never an error."""
    now = time.time() if now is None else now
    try:
        mark = f"{binary}:{os.stat(binary).st_mtime_ns}"
    except OSError as exc:
        return f"cannot run {binary}: {exc.strerror}"
    try:
        known = json.loads(record.read_text())
        if known.get("binary") == mark and (known.get("problem") is None or now - float(known.get("at", 0)) < PROBE_RETRY):
            return known.get("problem")
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    problem = probe()
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"binary": mark, "problem": problem, "at": now}))
    except OSError:
        pass
    return problem


def bwrap_probed(binary: str, *, run_probe: Callable[[str], str | None] | None = None, now: float | None = None) -> str | None:
    """A probe box's answer for the bwrap at `binary`, kept as a runtime's is (`kept`)."""
    run = run_probe or probe_bwrap
    return kept(state_dir() / "bwrap.probe", binary, lambda: run(binary), now=now)  # beside bwrap/, which holds the boxes' records alone
