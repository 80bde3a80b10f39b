"""Sandboxes behind other people's agents: an Inspect AI provider, an MCP server, a pytest plugin.

Each module here is an optional extra's (`quinebox[inspect]`, `quinebox[mcp]`) or an entry point's, and is
imported only by whoever asks for it: nothing on the plain path imports this package.
"""
