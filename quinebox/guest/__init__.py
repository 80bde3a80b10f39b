"""Code that runs inside boxes. Stdlib only: it is copied into the agent image under /opt/quinebox/guest and
must never import the host package.

    lifeline.py     the first process in every box: it ties the box's life to the host's (its init)
    init.py         the init's code, which lifeline.py runs (a script is compiled at every start; a module is not)
    protocol.py     the frames between a box and its host, imported by both sides so they agree by construction
    execs.py        commands the host asks the init to start beside the main one, over the lifeline
    checkpoints.py  the init around a checkpoint: its host connections let go of, its lifeline dialled again
    forwarder.py    the box's way out: connections to its own loopback handed to the host
    files.py        a long-lived box's files, read, written, listed and stat'd from inside it
    worldplan.py    the host's plans for /world carried out in the box: a rollback, a child's changes adopted
    agent.py        the agent loop, a box's main process when it runs a mission
    host.py         the agent's connection to the host: requests answered, or refused with an exit code
    prompt.py       what the model is told: the system prompt and its tools
    tools.py        the model's `sh` and `fork` tools, their output shown to it capped
    material.py     the material (the box's stdin) on fd 3, and how much of it the tools have read
    cli.py          `quinebox` inside a box: `run` and `exec`, one level down
"""
