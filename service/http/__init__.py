"""The HTTP API (FastAPI, versioned under ``/v1``, OpenAPI at ``/docs``): optimize jobs, plans, subgraphs, search,
measurement ingest, statistics, health and Prometheus metrics, behind API keys with scopes and a per-key rate limit.

    app = create_app(ServerConfig(...))          # service.http.app; ``tunebank serve`` runs it under uvicorn

One module per job: ``config`` (plain values from the settings), ``errors`` (one error hierarchy, one handler),
``auth`` (keys, scopes, rate limit), ``limits`` (body size, time), ``metrics``, ``uploads`` (models a client sends),
``submit`` (jobs, one per model, device and toolchain), ``lookups`` and ``search`` (what routes read), ``routes/``
(thin, one module per resource).
"""
