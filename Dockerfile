# The agent image: slim Debian, python3 (and `python`, Debian's python-is-python3),
# patch, a POSIX shell and coreutils, and
# the guest runtime at /.quinebox (a Python with its own loader and libraries,
# and the stdlib-only guest code), which quinebox copies out once and mounts
# into every box, whatever its image. Nothing is pip-installed, so the build
# needs no network beyond the base (`quinebox image build` bootstraps the base offline
# with debootstrap when no registry is reachable; that base already has python3,
# python-is-python3 and patch; a base bootstrapped before python-is-python3 was
# among them gets it from the Debian mirror).
ARG BASE=debian:bookworm-slim
FROM ${BASE}

RUN missing=""; \
    command -v python3 >/dev/null || missing="python3"; \
    command -v python >/dev/null || missing="$missing python-is-python3"; \
    command -v patch >/dev/null || missing="$missing patch"; \
    if [ -n "$missing" ]; then \
        apt-get update && apt-get install -y --no-install-recommends $missing \
        && apt-get clean && rm -rf /var/lib/apt/lists/*; \
    fi \
    && (grep -q '^agent:' /etc/passwd || echo 'agent:x:1000:1000:quinebox agent:/tmp:/usr/sbin/nologin' >> /etc/passwd) \
    && (grep -q '^agent:' /etc/group || echo 'agent:x:1000:' >> /etc/group) \
    && mkdir -p /world /run/quinebox \
    && chown 1000:1000 /world

COPY images/ /tmp/quinebox/images/
COPY quinebox/guest/ /tmp/quinebox/guest/
# `quinebox` inside a box is the guest's relay to the host, from the mounted runtime. images/init, the native init
# (images/init.c, built by the host's compiler for the build), is in the context when it could be built.
RUN sh /tmp/quinebox/images/runtime.sh /tmp/quinebox/guest /tmp/quinebox/images/init \
    && rm -rf /tmp/quinebox \
    && ln -sf /.quinebox/bin/quinebox /usr/local/bin/quinebox

LABEL io.quinebox.image="agent"
USER 1000:1000
WORKDIR /world
