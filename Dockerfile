# Production image of the DP-PPR service: a wheel built in one stage, installed in a slim one.
# Docker does not run on the development machines; tests/test_containers.py checks this file,
# .dockerignore and docker-compose.yml statically (and the wheel itself is installed and run by
# tests/test_wheel.py).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md alembic.ini ./
COPY service ./service
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PPR_HOST=0.0.0.0 \
    PPR_PORT=8000 \
    PPR_DATABASE_URL=sqlite:////data/ppr-ledger.db
COPY --from=build /wheels /wheels
# The wheel carries the ledger's migrations (service/migrations): no source tree is needed.
RUN pip install /wheels/*.whl && rm -rf /wheels \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin ppr \
    && mkdir -p /data /graphs && chown ppr:ppr /data
# /data: the default SQLite ledger (writable by the service's user); /graphs: edge lists,
# mounted read-only (PPR_GRAPH_PATH, or PPR_GRAPH_DIR for admin reloads by name).
VOLUME ["/data"]
WORKDIR /data
USER ppr
EXPOSE 8000
# Liveness only, on the port the service listens on (PPR_PORT); /readyz is for load balancers.
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PPR_PORT', '8000'), timeout=2)"]
CMD ["python", "-m", "service", "serve"]
