#!/bin/bash
t0=$(date +%s%N); trap 'echo "qb-elapsed-ns $(( $(date +%s%N) - t0 ))"' EXIT
set -e
sed -i 's/ - / + /' /app/add.py
