"""Build `quinebox-demo/busybox`: FROM scratch, Debian's static busybox and nothing else.

No Python, no libc, no package manager: the kind of image quinebox must run
all the same, with its lifeline and agent loop brought in at /.quinebox.

    python examples/images/busybox.py [TAG]
"""

import io
import shutil
import sys
import tarfile
from pathlib import Path

import docker

APPLETS = ("sh", "cat", "echo", "ls", "tr", "wc", "printf", "head", "sort", "uniq", "grep", "sed", "id", "sleep", "true")


def context(busybox: Path) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dockerfile = b"FROM scratch\nCOPY bin /bin\nCMD [\"sh\"]\n"
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        tar.add(str(busybox.resolve()), arcname="bin/busybox")
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    buf.seek(0)
    return buf


def main() -> int:
    tag = sys.argv[1] if len(sys.argv) > 1 else "quinebox-demo/busybox"
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not Path(busybox).exists():
        print("no busybox here: apt-get install busybox-static", file=sys.stderr)
        return 125
    docker.from_env(timeout=120).images.build(fileobj=context(Path(busybox)), custom_context=True, tag=tag, rm=True)
    print(f"built {tag}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
