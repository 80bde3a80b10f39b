"""What the model is told: the system prompt and the tools it may call. Stdlib only: it runs inside boxes."""

SYSTEM_PROMPT = """You are an agent: a POSIX process in a sandbox (a Linux container: {network}, read-only root; /world and /tmp are writable).
Your mission:

{mission}

Work only through tool calls. In `sh` commands, fd 3 reads the material you were given (your stdin), \
fd 4 writes your deliverable (your stdout, exactly as you write it) and fd 5 writes diagnostics. \
Plain stdout/stderr of a command come back to you, capped. \
For example: `wc -l <&3`, `printf 'done\\n' >&4`. The material is a stream: what you read is consumed.
Your files live in /world. After each sh call that changes them the host keeps a revision of /world, \
shown as [world revision N]; restore_world rolls the files back to one while you keep this conversation. \
Call fork to hand parts of the work to child agents, each in its own box with at most your grants \
and, by default, a copy-on-write view of your /world (their changes stay in their own world). \
Call exit with status "success" once the deliverable is written, or "failure" with a reason. \
Call exec with a note to yourself to continue in a fresh conversation when this one grows long."""



def network(granted, asked=""):
    """How the box may reach the network, from its grants as QUINEBOX_NET holds them ("" for none), and what a person
    may approve when asked, as QUINEBOX_ASK holds it."""
    rules = granted.split()
    if "net:bridge" in rules:
        return "the container engine's network (net:bridge)"
    said = "no network" if not rules else ("no direct network; through the host's proxy (HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are set) "
                                          f"you may reach only what these grants allow: {' '.join(rules)}")
    loopback = [rule.rsplit(":", 1)[1] for rule in rules if rule.startswith("net:host-loopback:")]
    if loopback:  # localhost is this box; the host's own loopback has one name
        said += f" (a service on the host's own loopback is reached as host-loopback:PORT, for port {', '.join(loopback)}; localhost is this box)"
    if asked.split():
        said += (f". A person may approve, one request at a time, what these rules cover: {asked}; "
                 "such a request waits for them, and a refusal is a 403 for a connection or exit 125 for a child")
    return said


TOOLS: list[dict] = [  # JSON schemas, as the model's API takes them
    {
        "type": "function",
        "function": {
            "name": "sh",
            "description": "Run a POSIX shell command in the box. fd 3 = material (stdin), fd 4 = deliverable (stdout), fd 5 = diagnostics.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command, run by /bin/sh -c."},
                    "timeout": {"type": "number", "description": "Seconds before the command is killed (default 120)."},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "fork",
            "description": "Start child agents, each in its own box with at most your grants. "
            "mode wait: all results; race: the first success wins and the others are killed; forget: start them and go on.",
            "parameters": {
                "type": "object",
                "properties": {
                    "children": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "mission": {"type": "string"},
                                "material": {"type": "string", "description": "The child's stdin."},
                                "grants": {"type": "array", "items": {"type": "string"}},
                                "model": {"type": "string"},
                                "image": {"type": "string", "description": "An image the host already has (default: yours)."},
                                "world": {
                                    "description": 'The child\'s /world: "inherit" (default; copy-on-write view of yours), "empty", or a list of paths in yours to copy.',
                                    "oneOf": [{"type": "string", "enum": ["inherit", "empty"]}, {"type": "array", "items": {"type": "string"}}],
                                },
                            },
                            "required": ["mission"],
                        },
                    },
                    "mode": {"type": "string", "enum": ["wait", "race", "forget"]},
                    "adopt": {"type": "boolean", "description": "race only: bring the winner's changes to its world into yours."},
                },
                "required": ["children", "mode"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "exec",
            "description": "Continue in a fresh conversation: same box, same files, same read position in the material; you keep only the mission and this note.",
            "parameters": {
                "type": "object",
                "properties": {"note": {"type": "string", "description": "What your next self needs to know."}},
                "required": ["note"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "restore_world",
            "description": "Roll the files in /world back to a revision; you keep this conversation, and the state before the restore is kept as a revision too.",
            "parameters": {
                "type": "object",
                "properties": {"revision": {"type": "integer", "description": "A revision number shown as [world revision N]; 0 is the world you started with."}},
                "required": ["revision"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "exit",
            "description": "Finish: success exits 0; failure exits 1 with the reason on stderr.",
            "parameters": {
                "type": "object",
                "properties": {
                    "status": {"type": "string", "enum": ["success", "failure"]},
                    "reason": {"type": "string"},
                },
                "required": ["status"],
            },
        },
    },
]
FINAL_TOOLS = [t for t in TOOLS if t["function"]["name"] in ("exec", "exit")]
