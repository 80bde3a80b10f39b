"""Sandboxes behind other people's agents: each framework's own sandbox interface, over the public API alone.

Holds the Inspect AI provider (inspect_sandbox.py, its task config inspect_config.py), the MCP server
(mcp_server.py: one class and every tool; what it checks and caps, mcp_checks.py; the file helper it runs in
a box, mcp_helper.py), the pytest plugin (pytest_plugin.py), and the providers of the agent frameworks (docs/frameworks/):
Harbor's environment (harbor.py), the OpenAI Agents SDK's sandbox client (openai_agents.py, its PTY sessions
openai_agents_pty.py), mini-swe-agent's environment (minisweagent.py), deepagents' sandbox and deepagents-code's
provider (deepagents.py), smolagents' remote Python executor (smolagents.py, its in-box side
smolagents_interpreter.py) and SWE-ReX's deployment (swerex.py, the loopback relay into the box swerex_relay.py).

Each module here is an optional extra's (`quinebox[inspect]`, `quinebox[harbor]`, …) or an entry point's, and is
imported only by whoever asks for it: nothing on the plain path imports this package. The framework providers use
only what `quinebox` exports (tests/unit/test_layout.py holds them to it): what they need is grown there, once.
"""
