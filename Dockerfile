# Production image of the DP-PPR service. Docker does not run on the development machines;
# this file is kept simple and is exercised by `docker compose up` where Docker exists.
FROM python:3.11-slim AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PPR_HOST=0.0.0.0 \
    PPR_PORT=8000

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY service ./service
COPY migrations ./migrations
RUN pip install . \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin ppr \
    && mkdir -p /data && chown ppr /data

USER ppr
EXPOSE 8000
# Liveness only: /readyz is for the load balancer (graph loaded, database reachable).
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2); sys.exit(0)"]
CMD ["python", "-m", "service", "serve"]
