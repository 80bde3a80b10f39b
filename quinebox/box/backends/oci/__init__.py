"""The OCI backend's room: runc by default, crun, gVisor's runsc, or any binary that speaks the same verbs.

runtime.py is its thin layer over a runtime's command line and each runtime's Capabilities (`Runtime`), where a
runtime's failures become quinebox's own in one place; box.py the box its owner starts; listed.py a box as the
runtime lists it (its Box: pause, exec, checkpoint); boxroot.py each box's own root and the one removal of its
remains; idmap.py a root-made box's own span of host ids and idview.py the idmapped view of an image; freezer.py
the cgroup freezer; criu.py whether CRIU works here; policy.py the box's policy as a
runtime's config.json (ranked with the rules); configure.py its configure step (at configure's tier); launch.py its
launch (at run's tier); warm.py its warm boxes and claim.py claiming one (both at the pool's tier); backend.py its
seam object (seam.Backend), registered in backends/registry.py by one line.
"""
