#!/usr/bin/env bash
# Everything quinebox needs on this machine, idempotently: a virtualenv with
# quinebox installed, a reachable Docker engine (installed and started when
# running as root on Debian/Ubuntu), and the agent image.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup: $*" >&2; }
is_root() { [ "$(id -u)" = 0 ]; }
have_apt() { command -v apt-get >/dev/null; }
apt_updated=
apt_install() {
    [ -n "$apt_updated" ] || { apt-get update -qq; apt_updated=1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# 1. Python: a virtualenv with quinebox and its test dependencies. Debian and Ubuntu ship `venv` without the
#    ensurepip it needs (that is python3-venv); the tests make a second venv of the distribution's own
#    /usr/bin/python3 (Debian 12's 3.11.2 is the oldest Python quinebox admits), so it needs one there too.
no_ensurepip() { [ -x "$1" ] || command -v "$1" >/dev/null && ! "$1" -c 'import ensurepip' >/dev/null 2>&1; }
if { [ ! -x .venv/bin/python ] && no_ensurepip python3; } || no_ensurepip /usr/bin/python3; then
    if is_root && have_apt; then say "installing python3-venv"; apt_install python3-venv; fi
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,ray,inspect,mcp,docs,view,otel,bwrap]' 2>&1 | grep -v '^WARNING: Location' >&2 || true
# Bytecode for our own modules even where PYTHONDONTWRITEBYTECODE is set: start-up counts.
.venv/bin/python -m compileall -q quinebox >/dev/null
.venv/bin/python -c 'import quinebox.cli' || { say "installing quinebox into .venv failed"; exit 125; }
# The native thin client (bin/quinebox.c) as `quinebox`: a served `quinebox exec` without an interpreter's start (~12 ms
# of CPU a command); anything else it execs the Python client for, kept beside it as quinebox-py (not quinebox.py: the
# script's directory comes first on its import path, where that name would be the quinebox package). pip, installing again,
# writes the Python client as `quinebox` once more: it is moved aside and the native one built again. With no C
# compiler, or a build that fails, `quinebox` stays the Python client.
if head -c 2 .venv/bin/quinebox | grep -q '^#!'; then mv .venv/bin/quinebox .venv/bin/quinebox-py; fi
if command -v cc >/dev/null && cc -O2 -Wall -Wextra -Werror -DQB_PYTHON="\"$PWD/.venv/bin/python\"" -DQB_SCRIPT="\"$PWD/.venv/bin/quinebox-py\"" \
        -o .venv/bin/quinebox.native bin/quinebox.c; then
    mv .venv/bin/quinebox.native .venv/bin/quinebox
else
    say "no native client (no C compiler, or its build failed above): quinebox is the Python client"
    cp -p .venv/bin/quinebox-py .venv/bin/quinebox
fi

engine_up() { .venv/bin/python -c 'import docker; docker.from_env(timeout=5).ping()' >/dev/null 2>&1; }

# 2. A Docker engine.
if ! engine_up; then
    if is_root && have_apt; then
        if ! command -v dockerd >/dev/null; then
            say "installing the distribution's Docker engine (docker.io)"; apt_install docker.io
        fi
        if ! pgrep -x dockerd >/dev/null; then
            say "starting dockerd (log: /var/log/quinebox-dockerd.log)"
            nohup setsid dockerd >/var/log/quinebox-dockerd.log 2>&1 </dev/null &
        fi
        for _ in $(seq 1 60); do engine_up && break; sleep 1; done
    fi
    if ! engine_up; then
        say "no Docker engine is reachable."
        say "  Debian/Ubuntu: run this script as root, or: sudo apt-get install docker.io && sudo systemctl start docker"
        say "  elsewhere: install Docker Engine, start it, and make its socket reachable (or set DOCKER_HOST)"
        exit 125
    fi
fi

# 3. OCI runtimes: runc runs boxes without the engine on their path (the default backend where it can), and
#    gVisor's runsc is the stronger alternative the tests also run on; bubblewrap runs a box as one process's argv.
runtimes=()
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || runtimes+=(runc)
command -v runsc >/dev/null || [ -x /usr/bin/runsc ] || runtimes+=(runsc)
command -v bwrap >/dev/null || runtimes+=(bubblewrap)  # not an OCI runtime: the kernel's floor, a box's argv (box/backends/bwrap/policy.py)
if [ "${#runtimes[@]}" -gt 0 ]; then
    if is_root && have_apt; then
        say "installing ${runtimes[*]} (OCI runtimes)"; apt_install "${runtimes[@]}"
    else
        say "missing ${runtimes[*]}: boxes run on the Docker engine only (apt-get install ${runtimes[*]})"
    fi
fi

# 3b. skopeo pulls an image from its registry where no engine can be asked (box/images/registry.py); the tests
#     push to Debian's docker-registry on loopback to prove it.
pulling=()
command -v skopeo >/dev/null || pulling+=(skopeo)
command -v docker-registry >/dev/null || pulling+=(docker-registry)
if [ "${#pulling[@]}" -gt 0 ]; then
    if is_root && have_apt; then
        say "installing ${pulling[*]} (images from a registry without the engine, and a registry for the tests)"; apt_install "${pulling[@]}"
    else
        say "missing ${pulling[*]}: without the engine, images come only from files and the cache (apt-get install skopeo)"
    fi
fi

# 4. The agent image; without a registry it is bootstrapped with debootstrap.
if is_root && have_apt && ! command -v debootstrap >/dev/null && [ ! -x /usr/sbin/debootstrap ]; then
    say "installing debootstrap (to build the base image without a registry)"; apt_install debootstrap
fi
.venv/bin/quinebox image build

# 4b. Users who are not root: the agent image in the machine's shared cache (/var/lib/quinebox/images), which
#     their boxes copy from with no engine (box/images/shared.py); newuidmap, for a box's subordinate uid range
#     where /etc/subuid gives one. Each such user then needs a cgroup for boxes' limits, once: on cgroup v1 and
#     hybrid machines (systemd delegates none there) `sudo quinebox setup-user NAME`; on v2, systemd's own.
if is_root; then
    .venv/bin/quinebox image share >/dev/null
    if ! command -v newuidmap >/dev/null && have_apt; then say "installing uidmap (newuidmap, for rootless boxes' uid ranges)"; apt_install uidmap; fi
    say "to let a user run boxes without root or the docker group: sudo quinebox setup-user NAME (once; again after a restart on cgroup v1)"
fi

# 5. What the demo and the tests build images of their own from (no registry):
#    a static busybox, musl's loader and compiler wrapper, and a C compiler.
missing=()
command -v busybox >/dev/null || [ -x /bin/busybox ] || missing+=(busybox-static)
command -v musl-gcc >/dev/null || missing+=(musl-tools)
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
if [ "${#missing[@]}" -gt 0 ]; then
    if is_root && have_apt; then
        say "installing ${missing[*]} (for images without Python in the demo and the tests)"; apt_install "${missing[@]}"
    else
        say "missing ${missing[*]}: the demo's and the tests' own images need them (apt-get install ${missing[*]})"
        exit 125
    fi
fi

# 6. bin/boxstart.c as quinebox-boxstart, beside the interpreter: each bwrap box's start sets its rlimits and (as root) its
# host ids with it rather than util-linux's prlimit and setpriv, two execs of dynamic programs (~2.5 ms a box). Static
# (no loader to run), musl's wrapper first; with no compiler, or a build that fails, bwrap boxes start as before.
rm -f .venv/bin/quinebox-boxstart
for cc in "musl-gcc -static" "cc -static" "cc"; do
    command -v ${cc%% *} >/dev/null || continue
    if $cc -O2 -Wall -Wextra -Werror -o .venv/bin/quinebox-boxstart.new bin/boxstart.c 2>/dev/null; then
        mv .venv/bin/quinebox-boxstart.new .venv/bin/quinebox-boxstart
        break
    fi
done
rm -f .venv/bin/quinebox-boxstart.new
