"""What a box's root is made of: images found, built, unpacked and sealed, and the guest's runtime.

Holds finding a box's image on the engine (lookup.py), building quinebox's
agent image (agent_image.py) and another project's Dockerfile
(dockerfiles.py, `quinebox.build_image`), images unpacked into read-only root filesystems
for the OCI runtimes (rootfs.py, layers.py, archives.py; registry.py with no
engine, through skopeo), what an unpacked
image held (seal.py), the guest's runtime copied out of the agent image
(guest_runtime.py), the host's own root as an image (host.py), the machine's
shared image cache root fills for every user (shared.py), when a box last
used each unpacked image (usage.py), and which unpacked images leave the
cache, and why (eviction.py).

May import: backends (the engine, to read and build images), the box's rules
(spec, policy) and below.
"""
