#!/usr/bin/env bash
# Set up (see setup.sh), then run every test against the real engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" tests
status=$?
if [ "$status" = 0 ] && [ $# = 0 ]; then
    # The CLI's tests once more, each command through a command server (the thin client's path): same behaviour.
    echo "test: the CLI's tests again, through \`quinebox serve\`" >&2
    QUINEBOX_TEST_SERVE=1 .venv/bin/python -m pytest -q -p no:cacheprovider \
        tests/e2e/test_cli.py tests/e2e/test_run_cli.py tests/e2e/test_terminals.py tests/e2e/test_approvals.py tests/e2e/test_fanout.py
    status=$?
fi
set -e
if [ "$status" = 5 ]; then
    echo "test: pytest collected no tests; that is a failure" >&2
    exit 1
fi
exit "$status"
