#!/bin/bash
t0=$(date +%s%N); trap 'echo "qb-elapsed-ns $(( $(date +%s%N) - t0 ))"' EXIT
if [ "$(python3 /app/add.py 40 2)" = 42 ] && [ "$(python3 /app/add.py -1 1)" = 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
