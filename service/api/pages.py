"""Pages for people: the admin dashboard at ``/admin`` and the API docs at ``/docs`` and
``/redoc``, every asset served from installed packages (no CDN, no external request).

* ``/admin`` and ``/admin/assets/*``: :mod:`service.dashboard`'s static files (HTML, CSS,
  JavaScript; charts are inline SVG drawn by its own code). The page talks to ``/v1/admin/...``
  only, with an admin key the browser keeps in ``sessionStorage``.
* ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc): their bundles as shipped by the
  ``fastapi-offline`` package, under ``/docs/assets/*``.

Every page response carries a Content-Security-Policy (scripts from this origin only; the one
inline script of Swagger UI is allowed by its hash), ``frame-ancestors 'none'`` and
``X-Content-Type-Options: nosniff``.
"""

from __future__ import annotations

import base64
import hashlib
import mimetypes
import re
from importlib import resources
from importlib.resources.abc import Traversable

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service.errors import NotFound, shown

DASHBOARD_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
_COMMON_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}
_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def _assets(root: Traversable) -> dict[str, bytes]:
    """Every file directly in ``root`` by name (read once: a fixed set, no path traversal)."""
    return {item.name: item.read_bytes() for item in root.iterdir() if item.is_file()}


def dashboard_assets() -> dict[str, bytes]:
    return _assets(resources.files("service.dashboard") / "static")


def docs_assets() -> dict[str, bytes]:
    return _assets(resources.files("fastapi_offline") / "static")


def _headers(csp: str, *, cache: str) -> dict[str, str]:
    return {**_COMMON_HEADERS, "Content-Security-Policy": csp, "Cache-Control": cache}


def _asset_response(files: dict[str, bytes], name: str, csp: str) -> Response:
    body = files.get(name)
    if body is None:
        raise NotFound(f"no asset {shown(name)}")
    suffix = "." + name.rsplit(".", 1)[-1] if "." in name else ""
    media = _MEDIA_TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"
    return Response(body, media_type=media, headers=_headers(csp, cache="no-cache"))


def _docs_csp(html: str, *, workers: bool = False) -> str:
    """Scripts from this origin plus the page's own inline scripts, allowed by hash."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in _INLINE_SCRIPT.findall(html)
    )
    worker = " worker-src 'self' blob:;" if workers else ""
    return (
        f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
        f"img-src 'self' data:; connect-src 'self'; font-src 'self' data:;{worker} "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def install_pages(app: FastAPI) -> None:
    """Add the ``/admin`` page and offline ``/docs`` and ``/redoc`` (the dashboard's API is
    among the app's shared routes, ``service.api.app.api_routes``). Build ``app`` with
    ``docs_url=None, redoc_url=None`` (these replace FastAPI's CDN pages)."""
    page_files = dashboard_assets()
    doc_files = docs_assets()
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/admin", include_in_schema=False)
    def admin_page() -> Response:
        return Response(
            page_files["index.html"],
            media_type="text/html; charset=utf-8",
            headers=_headers(DASHBOARD_CSP, cache="no-store"),
        )

    @app.get("/admin/", include_in_schema=False)
    def admin_slash() -> RedirectResponse:
        return RedirectResponse("/admin", status_code=308)

    @app.get("/admin/assets/{name}", include_in_schema=False)
    def admin_asset(name: str) -> Response:
        return _asset_response(page_files, name, DASHBOARD_CSP)

    @app.get("/docs/assets/{name}", include_in_schema=False)
    def docs_asset(name: str) -> Response:
        return _asset_response(doc_files, name, DASHBOARD_CSP)

    swagger = bytes(
        get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API docs",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="/docs/assets/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},
        ).body
    )
    redoc = bytes(
        get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url="/docs/assets/redoc.standalone.js",
            redoc_favicon_url="/docs/assets/favicon.png",
            with_google_fonts=False,
        ).body
    )
    swagger_headers = _headers(_docs_csp(swagger.decode()), cache="no-cache")
    redoc_headers = _headers(_docs_csp(redoc.decode(), workers=True), cache="no-cache")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        return HTMLResponse(swagger, headers=swagger_headers)

    @app.get("/redoc", include_in_schema=False)
    def redoc_ui(request: Request) -> HTMLResponse:
        return HTMLResponse(redoc, headers=redoc_headers)
