"""quinebox's front door: what `import quinebox` offers, and that importing it stays cheap (every name is lazy)."""

import subprocess
import sys

import quinebox
from quinebox.errors import ErrorKind


def test_error_kind_is_exported_as_the_enum_a_caller_decides_on():
    assert "ErrorKind" in quinebox.__all__
    assert quinebox.ErrorKind is ErrorKind
    assert quinebox.ErrorKind("not_found") is ErrorKind.NOT_FOUND


def test_every_exported_name_resolves():
    missing = [name for name in quinebox.__all__ if getattr(quinebox, name, None) is None]
    assert missing == []


def test_importing_quinebox_imports_none_of_its_modules():
    probe = "import sys, quinebox\nprint(' '.join(sorted(m for m in sys.modules if m.startswith('quinebox'))))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["quinebox"]
