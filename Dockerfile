# The testbed image: the `testbed` CLI, the simulator, the emulator and every tool they use, with the
# project at /testbed and its venv ready, so `make experiment` runs as it does on a host. Run it
# privileged (namespaces, tc, iptables, NFQUEUE); for the docker and containernet backends also in the
# host's PID namespace with the host's Docker socket and run directory, as Containernet setups do:
#   docker run --rm --privileged --pid host -v /var/run/docker.sock:/var/run/docker.sock \
#     -v /run/gdtb:/run/gdtb -v "$PWD/results:/testbed/results" gdtb/testbed make experiment
# (where --privileged is refused, as in sandboxes without CAP_SYS_RESOURCE, see the README)
# Build (from the project root, after `make wheels`): make testbed-image
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
COPY scripts/sysdeps.sh /tmp/sysdeps.sh
# the emulator's Debian tools, make, and the Docker CLI (docker exec into the role containers)
RUN /tmp/sysdeps.sh && apt-get install -y -q --no-install-recommends make docker.io \
 && rm -rf /var/lib/apt/lists/* /tmp/sysdeps.sh
WORKDIR /testbed
COPY . /testbed
# the same venv `make venv` makes, from the wheels built on the host (no index needed here)
RUN python3 -m venv .venv \
 && .venv/bin/pip install -q --no-cache-dir --no-index --find-links build/wheels/testbed -e '.[dev,mininet,docker]' \
 && touch .venv/bin/.installed && rm -rf build
CMD ["make", "experiment"]
