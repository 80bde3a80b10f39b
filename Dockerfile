# The agent image: slim Debian, python3, patch, a POSIX shell and coreutils, and
# the stdlib-only guest code. Nothing is pip-installed, so the build needs no
# network beyond the base (`quinebox image build` bootstraps the base offline
# with debootstrap when no registry is reachable; that base already has python3
# and patch).
ARG BASE=debian:bookworm-slim
FROM ${BASE}

RUN missing=""; \
    command -v python3 >/dev/null || missing="python3"; \
    command -v patch >/dev/null || missing="$missing patch"; \
    if [ -n "$missing" ]; then \
        apt-get update && apt-get install -y --no-install-recommends $missing \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && (grep -q '^agent:' /etc/passwd || echo 'agent:x:1000:1000:quinebox agent:/tmp:/usr/sbin/nologin' >> /etc/passwd) \
    && (grep -q '^agent:' /etc/group || echo 'agent:x:1000:' >> /etc/group) \
    && mkdir -p /world /run/quinebox /opt/quinebox \
    && chown 1000:1000 /world

COPY quinebox/guest/ /opt/quinebox/guest/
# The root filesystem is read-only in a box, so compile the guest now.
# `quinebox` inside a box is the guest's relay to the host.
RUN python3 -m compileall -q /opt/quinebox/guest \
    && chmod 755 /opt/quinebox/guest/cli.py \
    && ln -sf /opt/quinebox/guest/cli.py /usr/local/bin/quinebox

LABEL io.quinebox.image="agent"
USER 1000:1000
WORKDIR /world
