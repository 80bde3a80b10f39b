"""`quinebox doctor`: is this machine able to run boxes, and if not, what to do."""

from __future__ import annotations

import os

from rich.console import Console

from quinebox.box.spec import DEFAULT_IMAGE
from quinebox.errors import QuineboxError


def run() -> int:
    console = Console(stderr=True, highlight=False)
    failures = 0

    def check(ok: bool, what: str, fix: str = "") -> None:
        nonlocal failures
        failures += not ok
        mark = "[green]ok[/green]  " if ok else "[red]FAIL[/red]"
        console.print(f"{mark} {what}" + (f"\n      → {fix}" if fix and not ok else ""))

    from datetime import datetime

    from quinebox.box.watch import recent_incidents

    for incident in recent_incidents():
        when = datetime.fromtimestamp(incident["t"]).strftime("%Y-%m-%d %H:%M:%S")
        console.print(f"note  {when} the engine failed quinebox: {incident.get('what')}", markup=False, soft_wrap=True)
    from quinebox.box.backends.choice import choose, usable

    try:
        choice = choose(None)
        check(True, f"backend: {choice.why}")
    except QuineboxError as exc:
        check(False, "backend: the OCI runtime asked for can run boxes here", str(exc))
    for name in ("runc", "crun", "runsc"):
        problem = usable(name)
        console.print(f"note  OCI runtime {name}: {'can run boxes here' if problem is None else problem}", markup=False, soft_wrap=True)
    try:
        from quinebox.box.backends.docker import DockerBackend

        backend = DockerBackend.connect()
        info = backend.quick.info()
        version = backend.quick.version()
    except Exception as exc:  # a QuineboxError, or an engine that stopped answering between requests
        check(False, "Docker engine reachable and answering", str(exc) if isinstance(exc, QuineboxError) else f"it did not answer: {exc}")
        return 1
    check(True, f"Docker engine {version.get('Version')} (API {version.get('ApiVersion')}) at {backend.api.base_url}")
    security = " ".join(info.get("SecurityOptions") or [])
    check("seccomp" in security, "seccomp supported by the engine", "use a Docker engine built with seccomp and a kernel with CONFIG_SECCOMP_FILTER")
    check(bool(info.get("MemoryLimit")), "memory limits supported", "enable the memory cgroup controller (kernel cmdline cgroup_enable=memory)")
    check(bool(info.get("PidsLimit")), "pids limits supported", "enable the pids cgroup controller")
    from quinebox.box.image import image_exists

    present = image_exists(backend, DEFAULT_IMAGE)
    check(present, f"image {DEFAULT_IMAGE} present", "build it: quinebox image build")
    if present:
        from quinebox.box.runtime import runtime_dir

        try:
            where, problem = runtime_dir(backend, DEFAULT_IMAGE), ""
        except QuineboxError as exc:
            where, problem = "", str(exc)
        check(not problem, f"guest runtime for any image at {where or '(none)'}", problem or "")
    from quinebox.box.labels import live_boxes, owner_alive

    orphans = [box.session for box in live_boxes(backend) if not owner_alive(box.owner)]
    check(not orphans, "no orphaned boxes (their quinebox process is gone)", f"{len(orphans)} left: `quinebox gc` removes them")
    if os.geteuid() == 0:
        console.print("note  running as root: boxes run as uid 1000, so rw: grants must be writable by uid 1000")
    return 1 if failures else 0
