"""The bubblewrap backend's room (`--backend bwrap`): each box one `bwrap` process, at the kernel's floor.

No runtime and no engine between quinebox and the kernel: the same namespaces, seccomp filter, capabilities and
NoNewPrivs a runtime would set, said as bwrap's command line. policy.py renders the box's policy as that command line
and compiles its seccomp profile to BPF (ranked with the rules); programs.py keeps each compiled program, in the
process and in the state dir's `seccomp/`, so a cold command neither imports pyseccomp nor compiles; root.py makes the box's read-only root out of the
image's tree without writing it; cgroups.py the box's own cgroup in every hierarchy, placed before its first
instruction; box.py one running box (its start, its exit and OOM, its record, its removal); overlay.py the step that
mounts a child's copy-on-write world in a mount namespace of its box's own before bwrap binds it; listed.py a box as
this backend lists it (its Box: kill, pause, removal); configure.py its configure step (at configure's tier);
launch.py its launch (at run's tier); backend.py its seam object (seam.Backend), registered in backends/registry.py
by one line.
"""
