# Switchboard, a small production image. Usage and volumes: deploy/README.md.
#
#   docker build -t switchboard:latest .
#   docker run -p 8080:8080 -v switchboard-data:/app/data --env-file switchboard.env \
#     -v "$PWD/config/switchboard.toml:/app/config/switchboard.toml:ro" switchboard:latest
#
# One stage: every dependency (aiohttp, pydantic-core, asyncpg...) ships wheels for CPython 3.11
# on Linux, so nothing is compiled and a build stage would save nothing.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

RUN groupadd --system --gid 10001 switchboard \
    && useradd --system --uid 10001 --gid switchboard --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin switchboard

# The package with the PostgreSQL driver (several replicas share one database). The sources are
# only needed to build it.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core ./core
COPY providers ./providers
COPY channels ./channels
COPY gateway ./gateway
RUN pip install --no-cache-dir ".[postgres]" && rm -rf /src

# Relative paths in the configuration resolve from the working directory: config/knowledge and
# config/skills (shipped here, read-only) and data/ (the store, files, workspaces: the volume).
# `switchboard run` reads config/switchboard.toml when it exists (mount yours there), else the
# shipped config/switchboard.example.toml.
WORKDIR /app
COPY config ./config
RUN chmod -R a+rX /app/config \
    && mkdir -p /app/data \
    && chown switchboard:switchboard /app/data
VOLUME ["/app/data"]

# The default host, 127.0.0.1, is unreachable from outside a container. The environment wins over
# the configuration file.
ENV SWITCHBOARD__SERVER__HOST=0.0.0.0

USER switchboard
EXPOSE 8080

# No curl in the slim image: Python's urllib, bypassing any HTTP(S)_PROXY set for the model.
# Change the port with SWITCHBOARD__SERVER__PORT (not in the file) so this check follows it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:' + os.environ.get('SWITCHBOARD__SERVER__PORT', '8080') + '/healthz', timeout=4)"]

# SIGTERM drains: running turns get server.shutdown_grace_s (10 s by default) to finish, so stop
# with a longer timeout than Docker's 10 s default: `docker stop -t 30`.
STOPSIGNAL SIGTERM
CMD ["switchboard", "run"]
