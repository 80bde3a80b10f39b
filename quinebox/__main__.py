"""`python -m quinebox`: the `quinebox` command (how the thin client starts a command server with its own interpreter)."""

from quinebox.client import main

main()
