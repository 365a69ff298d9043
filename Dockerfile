# syntax=docker/dockerfile:1
# Sickbay: the runtime image for the worker, the webhook and the operator CLI. It carries the
# product only: not the cluster twin, the demo harness or the Temporal dev server (their
# command, `sickbay-dev`, comes with the dev install and the twin's image only).
#   docker build -t sickbay:0.1.0 .
#   docker run --rm sickbay:0.1.0 --help
# The entrypoint is the `sickbay` console script from pyproject.toml; the default command runs
# the worker. Runs as an unprivileged user (uid 10001) and writes nothing to the image's
# filesystem, so it works under readOnlyRootFilesystem (mount an emptyDir at /tmp).
#
# Reproducible: the base is pinned by digest (the multi-arch index of python:3.11-slim-bookworm;
# to move it: `docker buildx imagetools inspect python:3.11-slim-bookworm`, then replace the
# digest), and every Python package is installed from requirements.lock, which pins each version
# with its hashes (`make lock` regenerates it from pyproject.toml; pip refuses anything unhashed).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

# --- build: install the package and its dependencies into a self-contained venv -------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/sickbay
WORKDIR /src
# Dependencies first, from the lock only, so code edits do not reinstall them. The lock holds
# the build backend too (setuptools, wheel): the project builds without fetching anything.
COPY requirements.lock ./
RUN /opt/sickbay/bin/pip install --require-hashes --no-deps --requirement requirements.lock
COPY pyproject.toml README.md ./
COPY contract ./contract
COPY workflows ./workflows
COPY activities ./activities
COPY worker ./worker
COPY runbooks ./runbooks
# A regular (non-editable) install: the code lives in the venv, /src is not copied onward.
# Without twin/ and harness/ in the context, the wheel holds the product packages only.
RUN /opt/sickbay/bin/pip install --no-deps --no-build-isolation . \
    && /opt/sickbay/bin/sickbay --help > /dev/null \
    && ! /opt/sickbay/bin/python -c "import twin" 2>/dev/null \
    && ! /opt/sickbay/bin/python -c "import harness" 2>/dev/null

# --- twin: the cluster twin for the compose demo profile only (`--target twin`) ------------
# Not the runtime image: the default target (the last stage) never carries the twin. The
# package holds the product only (pyproject.toml); the dev tools come as the dev install adds
# them (harness/devinstall.py): their directory on the venv's path and the `sickbay-dev` command.
FROM build AS build-twin
WORKDIR /opt/sickbay-dev
COPY twin ./twin
COPY harness ./harness
RUN /opt/sickbay/bin/python -m harness.devinstall \
    && cd / && /opt/sickbay/bin/sickbay-dev twin --help > /dev/null

FROM ${PYTHON_IMAGE} AS twin
RUN groupadd --system --gid 10001 sickbay \
    && useradd --system --uid 10001 --gid sickbay --home-dir /home/sickbay --create-home \
       --shell /usr/sbin/nologin sickbay
COPY --from=build-twin /opt/sickbay /opt/sickbay
COPY --from=build-twin /opt/sickbay-dev /opt/sickbay-dev
ENV PATH=/opt/sickbay/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /home/sickbay
ENTRYPOINT ["sickbay-dev"]
CMD ["twin", "up"]

# --- runtime: the venv on a clean slim base, non-root --------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="sickbay" \
      org.opencontainers.image.description="Remediates failed GPUs in Kubernetes clusters as durable Temporal workflows" \
      org.opencontainers.image.licenses="Apache-2.0"
# /var/lib/sickbay/spool: the webhook's delivery spool. A named volume mounted there starts
# as a copy of this directory, so it must exist and belong to the non-root user.
RUN groupadd --system --gid 10001 sickbay \
    && useradd --system --uid 10001 --gid sickbay --home-dir /home/sickbay --create-home \
       --shell /usr/sbin/nologin sickbay \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/sickbay /var/lib/sickbay/spool
COPY --from=build /opt/sickbay /opt/sickbay
ENV PATH=/opt/sickbay/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SICKBAY_METRICS_PORT=9464 \
    SICKBAY_HEALTH_PORT=9465 \
    SICKBAY_HEALTHCHECK_URL=http://127.0.0.1:9465/healthz
USER 10001:10001
WORKDIR /home/sickbay
# 8080: webhook (POST /v1/alertmanager, GET /healthz); 9464: worker Prometheus metrics;
# 9465: the worker's GET /healthz (200 only while it polls Temporal, worker/health.py).
EXPOSE 8080 9464 9465
# One image, several roles: each role sets SICKBAY_HEALTHCHECK_URL to what it serves (the
# worker's /healthz by default, the webhook's /healthz in compose). Python's urllib, because
# the slim base has no curl. 30 s interval / 5 s timeout: a worker busy with a burst of
# activities still answers within 5 s; 3 misses (~90 s) before Docker calls it unhealthy.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['SICKBAY_HEALTHCHECK_URL'], timeout=4)"]
ENTRYPOINT ["sickbay"]
CMD ["worker"]
