#!/usr/bin/env bash
# The agent frameworks' venv, .venv-frameworks: quinebox with the extras of the six framework providers
# (quinebox/integrations/), pytest, hypothesis (tests/conftest.py sets it up) and LangChain's sandbox conformance
# suite (langchain-tests), for tests/frameworks/. Harbor needs Python >= 3.12 and .venv may be older (Debian 12's
# is 3.11), so this venv is of the first 3.12 found (the one tested), else a 3.13: on PATH, then under pyenv. None
# found is a failure, never a skip. Installed again only when pyproject.toml or this script changes.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "frameworks-venv: $*" >&2; }

# Each candidate is run, not only found: a pyenv shim is on PATH for every version pyenv has, global or not.
works() { "$1" -c 'import sys, venv; assert sys.version_info >= (3, 12)' >/dev/null 2>&1; }
find_python() {
    local candidate root="${PYENV_ROOT:-$HOME/.pyenv}"
    for candidate in "$(command -v python3.12)" "$root"/versions/3.12*/bin/python3 "$(command -v python3.13)" "$root"/versions/3.13*/bin/python3; do
        [ -n "$candidate" ] && [ -x "$candidate" ] && works "$candidate" && { echo "$candidate"; return; }
    done
    return 1
}

if ! .venv-frameworks/bin/python -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1; then
    python=$(find_python) || { say "no Python >= 3.12 here (Harbor's floor): install one (pyenv install 3.12, or the distribution's python3.12) and run again"; exit 1; }
    rm -rf .venv-frameworks
    "$python" -m venv .venv-frameworks
fi
stamp=$(cat pyproject.toml scripts/frameworks-venv.sh | sha256sum)
if [ "$(cat .venv-frameworks/installed 2>/dev/null)" != "$stamp" ]; then
    say "installing quinebox and the six frameworks into .venv-frameworks ($(.venv-frameworks/bin/python -V))"
    .venv-frameworks/bin/python -m pip install -q --disable-pip-version-check \
        -e '.[harbor,openai-agents,minisweagent,deepagents,smolagents,swerex]' 'pytest>=8' 'hypothesis>=6' 'langchain-tests>=1.1' 2>&1 | grep -v '^WARNING: Location' >&2 || true
    .venv-frameworks/bin/python -c 'import harbor, agents.sandbox, minisweagent, deepagents, smolagents, swerex, pytest, quinebox' ||
        { say "the frameworks did not install into .venv-frameworks"; exit 1; }
    echo "$stamp" > .venv-frameworks/installed
fi
