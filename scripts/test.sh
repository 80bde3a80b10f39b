#!/usr/bin/env bash
# Set up (see setup.sh), then run every test against the real engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" tests
status=$?
set -e
if [ "$status" = 5 ]; then
    echo "test: pytest collected no tests; that is a failure" >&2
    exit 1
fi
exit "$status"
