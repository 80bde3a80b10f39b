"""The Docker backend's room: everything quinebox does on the Docker engine, and nothing else imports docker-py.

engine.py is its thin layer over the Engine API (docker-py's low-level client, `DockerBackend`), where the engine's
failures become quinebox's own in one place; box.py a box on the engine (its Box: pause, exec, kill, remove);
configure.py its configure step (the image on the engine, the guest runtime, the container configuration: at
configure's tier); attached.py its stdio relayed over the engine's attach (at streams' tier); launch.py its launch
(at run's tier); warm.py its warm boxes (at the pool's); backend.py its seam object (seam.Backend), registered in
backends/registry.py by one line. This package's own import is light: docker-py loads only with engine.py, for a
box on the engine.
"""
