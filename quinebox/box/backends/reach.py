"""Why the Docker engine cannot be reached from here, told apart: not installed, not running, or running with a
socket this user may not open — three problems with three different fixes, which docker-py's one
"Error while fetching server API version" hides.

Asked only when a request failed (and by `quinebox doctor`): one connect to the engine's Unix socket, with a
deadline. A socket that accepts says nothing more here; whether the engine then answers is the client's to find.
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass

#: Where the engine listens when DOCKER_HOST does not say.
DEFAULT_SOCKET = "/var/run/docker.sock"
#: Where Debian's docker.io (and Docker's own packages) put the engine.
DOCKERD_PATHS = ("/usr/bin/dockerd", "/usr/sbin/dockerd", "/usr/local/bin/dockerd")
CONNECT_TIMEOUT = 2.0


@dataclass(frozen=True)
class Unreachable:
    reason: str  # one line: what is wrong with the engine (it is not named: the caller says "the Docker engine")
    fix: str  # the one command (or step) that fixes it


def as_root(command: str) -> str:
    """`command` as this user types it: through sudo unless already root."""
    return command if os.geteuid() == 0 else f"sudo {command}"


def engine_socket() -> str | None:
    """The engine's Unix socket per DOCKER_HOST; None when DOCKER_HOST names no Unix socket (tcp://, ssh://)."""
    host = os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    if host.startswith("unix://"):
        return host[len("unix://") :] or DEFAULT_SOCKET
    return None


def dockerd_installed() -> bool:
    return any(os.access(path, os.X_OK) for path in DOCKERD_PATHS)


def start_command() -> str:
    """How this machine starts the engine: through systemd where it is the init, else by hand."""
    return as_root("systemctl start docker") if os.path.isdir("/run/systemd/system") else f"{as_root('dockerd')} > /var/log/dockerd.log 2>&1 &"


def unreachable(path: str | None = None) -> Unreachable | None:
    """Why the engine's socket (`path`, default per DOCKER_HOST) cannot be opened; None when it accepts, or is not a Unix socket."""
    path = engine_socket() if path is None else path
    if path is None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CONNECT_TIMEOUT)
    try:
        conn.connect(path)
    except PermissionError:
        user = getpass.getuser()
        return Unreachable(
            f"permission denied on {path}: the engine runs, but user {user} may not use its socket",
            f"run boxes without the engine: `sudo quinebox setup-user {user}` once (rootless boxes on an OCI runtime), "
            f"or ask for the docker group (`sudo usermod -aG docker {user}`, root in all but name)",
        )
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        if not dockerd_installed():
            return Unreachable("not installed", as_root("apt-get install docker.io"))
        elsewhere = "" if path in (DEFAULT_SOCKET, "/run/docker.sock") else ", or point DOCKER_HOST at the socket it listens on"
        return Unreachable(f"installed but not running (nothing listens on {path})", f"start it: `{start_command()}`{elsewhere}")
    except TimeoutError:
        return Unreachable(f"did not accept a connection on {path} in {CONNECT_TIMEOUT:g} s: it may be wedged",
                           "restart it" + (f": `{as_root('systemctl restart docker')}`" if os.path.isdir("/run/systemd/system") else ""))
    except OSError as exc:
        return Unreachable(f"cannot open {path}: {exc.strerror or exc}", "set DOCKER_HOST to the engine's socket")
    finally:
        conn.close()
    return None
