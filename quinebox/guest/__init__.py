"""Code that runs inside boxes. Stdlib only: it is copied into the agent image
under /opt/quinebox/guest and must never import the host package."""
