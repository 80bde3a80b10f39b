"""A package index of one pure-Python wheel, `tinypkg`, in PEP 503's simple layout: what a box's pip installs from
a server on loopback (the egress tests' static server, smolagents' install_packages), never from the network."""

import zipfile
from pathlib import Path

#: What `import tinypkg; tinypkg.VALUE` says once it is installed.
VALUE = "installed from the index"


def write_index(root: Path) -> Path:
    """`root/packages/tinypkg-1.0-py3-none-any.whl` and `root/simple/tinypkg/index.html`; the wheel's path."""
    wheel = root / "packages" / "tinypkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    files = {
        "tinypkg/__init__.py": f"VALUE = {VALUE!r}\n",
        "tinypkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: quinebox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files["tinypkg-1.0.dist-info/RECORD"] = "".join(f"{name},,\n" for name in [*files, "tinypkg-1.0.dist-info/RECORD"])
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    (root / "simple" / "tinypkg").mkdir(parents=True)
    (root / "simple" / "tinypkg" / "index.html").write_text(f'<a href="../../packages/{wheel.name}">{wheel.name}</a>\n')
    return wheel
