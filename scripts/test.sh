#!/usr/bin/env bash
# Set up (see setup.sh), then run every test against the real engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The agent frameworks' venv (Python >= 3.12, Harbor's floor) installs while the first passes run; its pass waits for it.
frameworks_log=$(mktemp)
frameworks_venv=
if [ $# = 0 ]; then bash scripts/frameworks-venv.sh >"$frameworks_log" 2>&1 & frameworks_venv=$!; fi

# The web view's tests drive Debian's headless Chromium with Playwright (the `test` extra; never `playwright install`,
# which downloads a browser of its own). A missing browser fails those tests, never skips them.
say() { echo "test: $*" >&2; }
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing Debian's chromium (for the web view's tests in a real browser)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
    if [ ! -x /usr/bin/chromium ]; then
        say "no /usr/bin/chromium: tests/e2e/test_view.py needs it (apt-get install chromium)"
        [ "${CI:-}" != true ] || exit 1
    fi
fi
# Copy-on-write worlds are tested on a real XFS made on a loop device (tests/integration/test_world_clones.py).
if ! command -v mkfs.xfs >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing Debian's xfsprogs (for the copy-on-write worlds' tests on a real XFS)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq xfsprogs >/dev/null 2>&1 ||
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq xfsprogs >/dev/null; } || true
fi
if ! command -v mkfs.xfs >/dev/null && [ "$(id -u)" = 0 ]; then
    say "no mkfs.xfs: tests/integration/test_world_clones.py needs it (apt-get install xfsprogs)"
    [ "${CI:-}" != true ] || exit 1
fi
.venv/bin/python -c 'import playwright.sync_api' || { say "Playwright's Python package is missing from .venv (the test extra)"; exit 1; }
# The lint first, before any box starts: ruff's rules and mypy's settings are pyproject.toml's, and one finding fails the run.
[ -x .venv/bin/ruff ] && [ -x .venv/bin/mypy ] || { say "ruff or mypy is missing from .venv (the test extra)"; exit 1; }
say "ruff check quinebox"
.venv/bin/ruff check --no-cache quinebox || { say "ruff's findings above fail the run (each noqa left says why)"; exit 1; }
say "mypy (the whole package, the guest too)"
.venv/bin/mypy || { say "mypy's findings above fail the run (each type: ignore[code] left says why)"; exit 1; }
#: The box suites run on each backend's kernel view: the isolation, seccomp, hidden-box (`--image host`, which bwrap
#: refuses in one line), adversarial, exec, file-stream, agent and other-local-user suites, each case asserting its backend's own answer
#: where that view differs (tests/backend_under_test.py). As root the main pass runs them on auto's choice (bubblewrap,
#: where it is usable) and the runc pass once more on runc; a plain user's auto is runc (choice.PLAIN_USER), so the
#: rootless pass runs them on runc and the rootless bwrap pass on bubblewrap. Their Docker cases (and the engine's own
#: request-timeout case) ran in the main pass; the rootless pass has no engine to run them on.
box_files="tests/integration/test_isolation.py tests/integration/test_seccomp.py tests/integration/test_host_image.py
    tests/integration/test_hostile_box.py tests/integration/test_exec_api.py tests/integration/test_file_streams.py tests/integration/test_agent.py
    tests/integration/test_other_users.py"

serve_pass() {
    # The CLI's tests once more, each command through a command server (the thin client's path): same behaviour.
    echo "test: the CLI's tests again, through \`quinebox serve\`"
    QUINEBOX_TEST_SERVE=1 .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp "$passes/s" \
        tests/e2e/test_cli.py tests/e2e/test_run_cli.py tests/e2e/test_terminals.py tests/e2e/test_approvals.py tests/e2e/test_fanout.py \
        tests/e2e/test_egress.py::test_a_grant_that_can_never_work_is_refused_before_any_box_starts \
        tests/e2e/test_egress.py::test_host_loopback_reaches_one_port_by_name_and_each_refusal_is_one_line_and_one_record \
        tests/e2e/test_egress.py::test_an_agents_refused_destination_is_one_line_on_the_runs_stderr
}
docker_pass() {
    # The default backend is bubblewrap or an OCI runtime here: the box tests and the e2e suite once more on the Docker
    # backend, less what names its own backends and ran whole in the main pass: the engine-only tests (the pool's and
    # the cluster's pin it); the long-lived boxes', the server keeper's and `resume`'s, which run each backend
    # themselves; the OCI pool's and gVisor's snapshots'; `prune`'s, whose image cases pin the OCI backend and whose
    # session cases read only the state dir, as the web view's do.
    echo "test: the box and e2e tests again, on the Docker backend"
    QUINEBOX_BACKEND=docker .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp "$passes/d" tests/integration/test_isolation.py \
        tests/integration/test_seccomp.py tests/integration/test_any_image.py tests/integration/test_exec_api.py \
        tests/integration/test_sandbox_files.py tests/integration/test_sandbox_attach.py tests/e2e \
        --ignore=tests/e2e/test_cluster.py --ignore=tests/e2e/test_pool.py --ignore=tests/e2e/test_sandboxes.py \
        --ignore=tests/e2e/test_view.py --ignore=tests/e2e/test_serve_keeper.py --ignore=tests/e2e/test_resume.py \
        --ignore=tests/e2e/test_pool_oci.py --ignore=tests/e2e/test_box_snapshots.py --ignore=tests/e2e/test_prune.py
}
gvisor_pass() {
    # gVisor's kernel answers the box's system calls itself: the isolation and seccomp suites run whole there,
    # each case asserting gVisor's own answer where it differs (its /proc, its sysfs, its errno); the image,
    # terminal, agent and host-root tests again, less three still open there: one lists a directory with `ls` (this runsc
    # refuses coreutils' statx with EINVAL), one expects EROFS where gVisor checks the user's permission first,
    # and 20 MB of material through fd 3.
    echo "test: the isolation, seccomp, image, terminal and agent tests again, on gVisor (runsc)"
    QUINEBOX_BACKEND=oci QUINEBOX_RUNTIME=runsc .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp "$passes/g" \
        tests/integration/test_gvisor.py tests/integration/test_isolation.py tests/integration/test_seccomp.py \
        tests/integration/test_any_image.py tests/integration/test_agent.py tests/integration/test_host_image.py tests/e2e/test_terminals.py \
        -k "not foreign_image_through and not 20_mb_of_material and not read_only_refuses"
}
frameworks_pass() {
    # Each agent framework's own run (Harbor's oracle, the Agents SDK's runner, mini-swe-agent's, deepagents',
    # smolagents' and SWE-ReX's) with quinebox as its sandbox, in the frameworks' venv (scripts/frameworks-venv.sh).
    if [ "$frameworks_ok" = 1 ]; then
        echo "test: the agent frameworks' own runs, quinebox as their sandbox ($(.venv-frameworks/bin/python -V))"
        QUINEBOX_TEST_FRAMEWORKS=1 .venv-frameworks/bin/python -m pytest -q -p no:cacheprovider --basetemp "$passes/f" tests/frameworks
    else
        cat "$frameworks_log"
        echo "test: the frameworks' venv could not be made (above): their tests cannot run"
        return 1
    fi
}
debian_venv() {
    # The distribution's own python3 (Debian 12's is 3.11.2: no tarfile filters, which came in 3.11.4) in a venv
    # of its own. A venv left without pip by a failed creation (no ensurepip then) is made again, never reused broken.
    .venv-debian/bin/python -m pip --version >/dev/null 2>&1 || { rm -rf .venv-debian; /usr/bin/python3 -m venv .venv-debian; }
    if ! cmp -s pyproject.toml .venv-debian/pyproject.toml; then  # installed again only when the dependencies change
        # quinebox and, of the test extra, only what these tests use (no browser, no cluster): half the time to install.
        wanted=$(.venv-debian/bin/python -c 'import tomllib; print(*(r for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"] if r.startswith(("pytest", "hypothesis"))))')
        .venv-debian/bin/python -m pip install -q --disable-pip-version-check -e . $wanted 2>&1 | grep -v '^WARNING: Location' || true
        .venv-debian/bin/python -c 'import quinebox.cli, pytest' && cp pyproject.toml .venv-debian/pyproject.toml
    fi
}
debian_skip="not 50_mb and not quiet_spell_longer"
debian_oci_pass() {
    # The tests that extract archives, build worlds and start boxes once more under it, on both backends
    # (test_sandbox.py runs each backend itself).
    debian_venv || return 1
    echo "test: archives, worlds and boxes again under /usr/bin/python3 ($(.venv-debian/bin/python -c 'import platform; print(platform.python_version())')), on the OCI backend"
    QUINEBOX_BACKEND=oci .venv-debian/bin/python -m pytest -q -p no:cacheprovider --basetemp "$passes/o" tests/unit/test_untar.py tests/unit/worlds tests/unit/box/test_rootfs.py \
        tests/integration/test_rootfs_engine.py tests/integration/test_sandbox.py tests/integration/test_exec_api.py \
        tests/integration/test_registry.py tests/integration/test_file_streams.py tests/integration/test_host_image.py \
        tests/integration/test_sandbox_files.py tests/integration/test_sandbox_attach.py tests/unit/box/test_policy_host.py tests/e2e/test_world_boxes.py tests/unit/tree/test_pruning.py tests/unit/tree/test_retention.py \
        tests/unit/audit/test_audit_segments.py tests/unit/box/test_image_usage.py -k "$debian_skip"
}
debian_docker_pass() {
    echo "test: archives, worlds and boxes again under /usr/bin/python3, on the Docker backend"
    QUINEBOX_BACKEND=docker .venv-debian/bin/python -m pytest -q -p no:cacheprovider --basetemp "$passes/e" \
        tests/integration/test_exec_api.py tests/e2e/test_world_boxes.py -k "$debian_skip"
}
runc_pass() {
    echo "test: the isolation, seccomp, hidden-box, adversarial, exec, file-stream and agent tests again, on runc (as root)"
    # shellcheck disable=SC2086  # the list splits on whitespace
    QUINEBOX_BACKEND=oci QUINEBOX_RUNTIME=runc .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp "$passes/b" $box_files -k "not docker and not quiet_spell_longer"
}
rootless_user=quinebox-rootless  # not test_doctor.py's user, which must have no cgroup delegated
rootless_setup() {
    # As a user who is not root and may not use the engine (CI makes one; its boxes are rootless, in a cgroup
    # `setup-user` delegates it). Its own copy of the tree and a venv of Debian's python3, in a directory it may read
    # whatever the clone's own permissions; short paths (--basetemp), as Unix sockets need.
    id -u "$rootless_user" >/dev/null 2>&1 || useradd --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$rootless_user"
    grep -q "^$rootless_user:" /etc/subuid || usermod --add-subuids 300000-365535 --add-subgids 300000-365535 "$rootless_user"
    .venv/bin/quinebox setup-user "$rootless_user" || return 1
    work=$(mktemp -d /tmp/qbr-XXXX)
    git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$work" --one-top-level=src
    /usr/bin/python3 -m venv "$work/venv" || return 1
    # quinebox with the extras of the features it runs (Inspect, MCP, the view, bwrap's seccomp binding) and, of the test extra, what these tests use.
    wanted=$("$work/venv/bin/python" -c 'import tomllib; print(*(r for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"] if r.startswith(("pytest", "hypothesis", "playwright"))))')
    extras=inspect,mcp,view
    grep -q '^bwrap *=' pyproject.toml && extras=$extras,bwrap
    "$work/venv/bin/python" -m pip install -q --disable-pip-version-check -e "$work/src[$extras]" $wanted 2>&1 | grep -v '^WARNING: Location' || true
    # bwrap's starter (bin/boxstart.c) beside its interpreter too, as setup builds it beside .venv's
    [ ! -x .venv/bin/quinebox-boxstart ] || cp .venv/bin/quinebox-boxstart "$work/venv/bin/"
    mkdir -p "$work/home" "$work/tmp"
    chown -R "$rootless_user:" "$work"
}
# as_rootless ENV... -- PYTEST-ARGS: pytest as the rootless user, in its copy of the tree.
as_rootless() {
    local env=()
    while [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    runuser -u "$rootless_user" -- env -i PATH="$work/venv/bin:/usr/bin:/bin:/usr/sbin:/sbin" HOME="$work/home" TMPDIR="$work/tmp" CI=true QUINEBOX_TEST_ROOTLESS=1 "${env[@]}" \
        bash -c 'cd "$0" && exec python -m pytest -q -p no:cacheprovider "$@"' "$work/src" "$@"
}
rootless_pass() {
    # The box tests, Inspect's and MCP's, and the e2e suite (the view in Chromium too) once more, less what only root has
    # here (tests/conftest.py's rootless pass deselects it), on auto's choice for a plain user (runc).
    echo "test: the box and e2e tests again, as $rootless_user (not root, no engine: rootless boxes)"
    as_rootless -- tests/unit/box/test_rootless.py tests/integration/test_rootless_boxes.py \
        tests/integration/test_exec_api.py tests/integration/test_sandbox.py tests/integration/test_file_streams.py \
        tests/integration/test_seccomp.py tests/integration/test_isolation.py tests/integration/test_oci_backend.py \
        tests/integration/test_host_image.py tests/integration/test_any_image.py tests/integration/test_registry.py \
        tests/integration/test_box_removal.py tests/integration/test_hostile_box.py tests/integration/test_agent.py \
        tests/integration/test_writable_root.py tests/integration/test_root_exec.py tests/integration/test_sandbox_files.py \
        tests/integration/test_sandbox_attach.py tests/integration/test_keeper.py \
        tests/integration/test_inspect.py tests/integration/test_mcp.py tests/unit/tree/test_pruning.py tests/unit/tree/test_retention.py \
        tests/unit/audit/test_audit_segments.py tests/unit/audit/test_audit_bound_writers.py tests/unit/test_private_modes.py tests/unit/test_state_trust.py tests/unit/test_egress_errors.py \
        tests/unit/box/test_image_usage.py tests/e2e \
        -k 'not 50_mb and not quiet_spell_longer and not a_bad_grant_starts_nothing' --basetemp "$work/t"
}
rootless_bwrap_pass() {
    echo "test: the bubblewrap backend's suites again, as $rootless_user"
    # shellcheck disable=SC2086
    # and the backend's own tests (as root they ran in the main pass): its boxes, their remains, its root, its choice.
    as_rootless QUINEBOX_BACKEND=bwrap -- $box_files tests/integration/test_bwrap_backend.py tests/integration/test_bwrap_remains.py \
        tests/unit/box/test_bwrap_root.py tests/unit/box/test_bwrap_listed.py tests/unit/box/test_choice_bwrap.py \
        -k 'not docker and not quiet_spell_longer' --basetemp "$work/b"
}
# The lane of every pass as root: each lists every box on the shared engine (e2e's wait_for_box and its `== []` checks,
# test_terminals', test_sandbox's) or puts some there (their Docker cases; and any pass's first box of an image, as root,
# unpacks it from the engine through a labelled scratch container: the frameworks' and bwrap's too), so one at a time.
lane_engine() {
    pass serve serve_pass
    pass docker docker_pass
    pass gvisor gvisor_pass
    pass runc runc_pass
    pass frameworks frameworks_pass
    if [ -x /usr/bin/python3 ] && [ "$(/usr/bin/python3 -c 'import sys; print(sys.version)')" != "$(.venv/bin/python -c 'import sys; print(sys.version)')" ]; then
        pass debian-oci debian_oci_pass
        pass debian-docker debian_docker_pass
    else
        say ".venv is the distribution's own python3 already (or there is none): no second pass under it"
    fi
}
# Beside it, the passes that never reach the engine: the rootless user's (no engine at all; its boxes in its own state
# dir and its delegated cgroups), on auto's choice for a plain user (runc) and on bubblewrap.
lane_apart() {
    if [ "$(id -u)" = 0 ] && [ "${CI:-}" = true ]; then
        pass rootless-setup rootless_setup
        if [ "$(cat "$passes/rootless-setup.status")" = 0 ]; then
            pass rootless rootless_pass
            pass rootless-bwrap rootless_bwrap_pass
        fi
        rm -rf "$work"
    fi
}

# Each pass's wall time is printed (`test: pass NAME took N s`); a pass's status is kept in $passes/NAME.status and any
# pass that failed (pytest's 5, nothing collected, too) fails the run. The main pass runs first and alone; the others then
# run in two lanes side by side (lane_engine, lane_apart), each pass with its own --basetemp (concurrent pytest sessions
# would prune each other's) and its own log, printed whole when the pass ends.
work=
passes=$(mktemp -d /tmp/qbt-XXXX)  # short: a box's Unix sockets live under a pass's --basetemp
chmod 755 "$passes"
took() { say "pass $1 took $2 s"; }
# pass NAME CMD...: run one pass, its output into $passes/NAME.log; then print that log whole (one lane at a time) and its time.
pass() {
    local name=$1 began=$SECONDS status
    shift
    "$@" >"$passes/$name.log" 2>&1 </dev/null
    status=$?
    [ "$status" != 5 ] || echo "test: pass $name: pytest collected no tests; that is a failure" >>"$passes/$name.log"
    echo "$status" >"$passes/$name.status"
    {
        flock 9
        echo "test: ---- pass $name (exit $status) ----" >&2
        cat "$passes/$name.log" >&2
        took "$name" $((SECONDS - began))
    } 9>"$passes/.print"
}
set +e
began=$SECONDS
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" tests
status=$?
took main $((SECONDS - began))
if [ "$status" = 0 ] && [ $# = 0 ]; then
    # The reference pages (mkdocs.yml, strict: a broken link or anchor, or a page not in the nav, fails).
    # Not --quiet: mkdocs 1.6's --quiet hides warnings from strict mode too (mkdocs/mkdocs#4126), and the build passes.
    echo "test: the docs, built with mkdocs --strict" >&2
    .venv/bin/mkdocs build --strict --site-dir "$(mktemp -d)"
    status=$?
fi
if [ "$status" = 0 ] && [ $# = 0 ]; then
    # The frameworks' venv, made while the main pass ran (a lane's subshell cannot wait for this shell's child).
    frameworks_ok=1
    wait "$frameworks_venv" || frameworks_ok=0
    lane_engine & engine_lane=$!
    lane_apart & apart_lane=$!
    wait "$engine_lane" "$apart_lane"
    for done in "$passes"/*.status; do
        [ "$(cat "$done")" = 0 ] || { say "pass $(basename "$done" .status) failed (its log above)"; status=1; }
    done
fi
set -e
rm -rf "$passes"
if [ "$status" = 5 ]; then
    echo "test: pytest collected no tests; that is a failure" >&2
    exit 1
fi
exit "$status"
