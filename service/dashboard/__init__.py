"""The web dashboard: database coverage, recent jobs, a job's per-subgraph report and a 2-D map of the embedding
space, as server-rendered pages (Jinja2) with Chart.js vendored under ``static/vendor`` (no build step).

    app.include_router(dashboard_router(database))
"""

from service.dashboard.router import dashboard_router

__all__ = ["dashboard_router"]
