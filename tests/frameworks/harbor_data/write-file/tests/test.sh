#!/bin/bash
t0=$(date +%s%N); trap 'echo "qb-elapsed-ns $(( $(date +%s%N) - t0 ))"' EXIT
if [ "$(pwd)" = /app ] && [ "$(cat /app/hello.txt)" = "hello from the box" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
