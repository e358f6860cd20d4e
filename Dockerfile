# The ledgerweb server image: one image, a command per role (deploy/container/entrypoint):
# serve (the default), worker, migrate, demo; any other argument is a ledgerweb command.
#
#   docker build -t ledgerweb .            (or: buildah bud --format docker -t ledgerweb .)
#   docker run --rm -v ledgerweb-data:/var/lib/ledgerweb ledgerweb migrate
#   docker run -d -p 8000:8000 -v ledgerweb-data:/var/lib/ledgerweb ledgerweb serve
#
# compose.yaml runs it with PostgreSQL; docs/deploy.md walks through both.
#
# PYTHON_IMAGE selects the base: the official Python slim image. Any image with Python 3.12+ as
# python3 on PATH, a POSIX shell and useradd will do (tests/test_container.py builds one from
# Debian packages, as base images cannot be pulled where the suite runs).
ARG PYTHON_IMAGE=docker.io/library/python:3.13-slim-bookworm

# -- build: the server and its pinned dependencies in a virtualenv ------------------------------
FROM ${PYTHON_IMAGE} AS build
# Optional, for the build only: a package mirror, or the CA of a TLS-intercepting proxy.
ARG PIP_INDEX_URL
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# The whole dependency tree from the lock (scripts/lock), each file checked against its hash; a
# layer of its own, so a build whose lock is unchanged reuses it.
COPY requirements.lock ./
RUN python3 -m venv /opt/ledgerweb \
 && /opt/ledgerweb/bin/pip install --quiet --require-hashes --no-deps -r requirements.lock
# .dockerignore lets in only what the wheel is built from; its dependencies are all there.
COPY . .
RUN /opt/ledgerweb/bin/pip install --quiet --no-deps . \
 && /opt/ledgerweb/bin/pip check \
 && /opt/ledgerweb/bin/ledgerweb help >/dev/null

# -- runtime: the virtualenv, the entrypoint, a user without privileges --------------------------
FROM ${PYTHON_IMAGE}
ENV PATH=/opt/ledgerweb/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/ledgerweb \
    LEDGERWEB_DATA_DIR=/var/lib/ledgerweb \
    LEDGERWEB_BIND=0.0.0.0:8000
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/ledgerweb --no-create-home \
        --shell /usr/sbin/nologin ledgerweb \
 && mkdir -p /var/lib/ledgerweb \
 && chown ledgerweb:ledgerweb /var/lib/ledgerweb \
 && chmod 0750 /var/lib/ledgerweb
COPY --from=build /opt/ledgerweb /opt/ledgerweb
COPY deploy/container/entrypoint /usr/local/bin/ledgerweb-entrypoint
USER 10001:10001
WORKDIR /var/lib/ledgerweb
# The SQLite ledger (when DATABASE_URL is unset), the generated secret key, static files.
VOLUME ["/var/lib/ledgerweb"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["ledgerweb-entrypoint", "healthcheck"]
ENTRYPOINT ["ledgerweb-entrypoint"]
CMD ["serve"]
