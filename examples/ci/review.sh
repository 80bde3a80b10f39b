#!/usr/bin/env bash
# Review a change with an agent on any CI; the job fails when the review does.
#
#   examples/ci/review.sh [BASE]        BASE defaults to origin/main
#
# The model comes from OPENAI_API_KEY / OPENAI_BASE_URL / QUINEBOX_MODEL, or
# QUINEBOX_REVIEW_MODEL (for example script:examples/missions/review-approve.yaml).
# The review is written to review.md; the summary line goes to stderr as JSON.
# Nothing here is interactive: no prompts, no colour when there is no terminal.
set -euo pipefail

base=${1:-origin/main}
model=()
if [ -n "${QUINEBOX_REVIEW_MODEL:-}" ]; then
    model=(--model "$QUINEBOX_REVIEW_MODEL")
fi
mission="Review this diff as a careful senior engineer. Write the review to the deliverable as Markdown.
Call exit with status failure (and the reason) if the change adds a bug, a secret or a TODO left for later;
otherwise call exit with status success."

status=0
git diff "$base"...HEAD | quinebox run "${model[@]}" --timeout "${QUINEBOX_REVIEW_TIMEOUT:-10m}" \
    --max-tokens "${QUINEBOX_REVIEW_TOKENS:-200000}" --json "$mission" > review.md || status=$?
cat review.md
case $status in
    0) echo "review: approved" >&2 ;;
    1) echo "review: changes requested" >&2 ;;
    75) echo "review: the model provider was unavailable; try again" >&2 ;;
    *) echo "review: quinebox failed (exit $status)" >&2 ;;
esac
exit "$status"
