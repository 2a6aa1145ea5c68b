"""The FastAPI application factory.

``create_app(settings)`` builds an app whose lifespan opens the ledger (refusing an
un-migrated database), builds the caches and loads the graph before the first request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute

from service import __version__
from service.api.error_responses import install_error_handlers
from service.api.observability import CACHE_EVENTS, RequestObservation
from service.api.openapi import install_openapi
from service.api.pages import install_pages
from service.api.routes import (
    admin,
    batch,
    dashboard,
    embeddings,
    operations,
    planning,
    ppr,
    similar,
    synthetic,
)
from service.api.runtime import Runtime, RuntimeStarter, stop_this_process
from service.api.size_limits import RequestLimits
from service.config import Settings, get_settings
from service.logs import configure_logging

DESCRIPTION = """
Differentially private personalized PageRank. Every answer comes from a noisy graph diffusion
and is charged, before any noise is drawn, to a durable per-account budget composed by a
Rényi-DP accountant. Authenticate with `Authorization: Bearer <api key>`.
"""


def _count_cache_event(cache: str, event: str) -> None:
    CACHE_EVENTS.labels(cache, event).inc()


@cache
def api_routes() -> tuple[BaseRoute, ...]:
    """The API's routers, included once per process, for every app to route through.

    FastAPI builds an included route's request handler (the pydantic validators of its
    parameters, body and dependencies) once per inclusion, on the first request that reaches
    its router: 40 ms of CPU on an app's first request, and again for every app built. Every
    app of this process (one per worker; one per test in the test suite) routes through these
    same inclusions, so that work is done once. The routers carry their prefixes and tags, and
    the apps use FastAPI's defaults, so an inclusion here is what ``app.include_router`` makes
    (no app overrides dependencies: ``dependency_overrides`` is not used)."""
    shared = APIRouter()
    shared.include_router(batch.router)
    shared.include_router(similar.router)  # before any /v1/embeddings/{node} route
    shared.include_router(ppr.router)
    shared.include_router(embeddings.router)
    shared.include_router(admin.router)
    shared.include_router(planning.router)
    shared.include_router(synthetic.router)
    shared.include_router(operations.router)
    shared.include_router(dashboard.router)  # the admin dashboard's API
    return tuple(shared.routes)


def create_app(settings: Settings | None = None, *, configure_logs: bool = True) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if configure_logs:
            configure_logging(settings)

        def serve_with(runtime: Runtime) -> None:
            app.state.runtime = runtime
            runtime.start_background()

        app.state.runtime = None  # until built: 503 ledger_unavailable (see RuntimeStarter)
        starter = RuntimeStarter(
            settings,
            on_ready=serve_with,
            on_failure=lambda exc: stop_this_process(),
            on_cache_event=_count_cache_event,
        )
        app.state.runtime_starter = starter
        runtime = starter.start()
        if runtime is not None:
            serve_with(runtime)
        try:
            yield
        finally:
            starter.stop()
            if app.state.runtime is not None:
                app.state.runtime.close()

    app = FastAPI(
        title="DP personalized PageRank",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc come from install_pages, with packaged assets
        redoc_url=None,
    )
    app.add_middleware(
        RequestLimits,
        max_body_bytes=settings.max_body_bytes,
        max_header_bytes=settings.max_header_bytes,
    )
    app.add_middleware(RequestObservation)  # outermost: request ids and logs cover the limits
    install_error_handlers(app)
    app.router.routes.extend(api_routes())
    install_pages(app)  # /admin and offline /docs, /redoc
    install_openapi(app, settings)
    return app
