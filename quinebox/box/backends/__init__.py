"""Where boxes run: the Docker engine and the OCI runtimes, each as a thin layer and its box.

Holds the engine's thin layer (docker.py), an OCI runtime's (oci.py) and one
box on it (ocibox.py); a box as every backend lists it (boxes.py: the Box
protocol, with DockerBox in dockerbox.py and RuntimeBox in runtimebox.py, each
the one way to kill, exec into and remove its box); each box's own root over
its image and the one removal of a runtime box's remains (boxroot.py), a
root-made box's own span of host ids for its user namespace (idmap.py) and
the idmapped view of an image a writable root lies over (idview.py), what
removes a dead process's runtime boxes (reaper.py), which backend a box runs
on (choice.py, probe.py), each way a box could run here and its fix (ways.py,
reach.py), and noticing an engine gone quiet (watch.py).

May import: the box's rules (spec, policy), streams and below.
"""
