"""The admin dashboard's static files (``static/``): HTML, CSS and plain JavaScript, charts
drawn as inline SVG by ``charts.js``. Served at ``/admin`` by :mod:`service.api.pages`; no
build step, no CDN, no request anywhere but this service's ``/v1/admin/...`` API."""
