"""HTTP gateway (FastAPI). Installed as lookupspec.gateway.

Modules: ``app`` (build_app, create_app, build_service), ``lifecycle`` (loading, ready, draining),
``protocol`` (every pydantic body), ``routes_openai`` / ``routes_documents`` / ``routes_ops`` (thin
routers), ``planning`` (request -> validated job, through ``lookupspec.planning``), ``jobs`` (job,
events, ticket), ``service`` (bounded queue + the one generation worker), ``streaming`` (JSON and SSE
responses), ``indexes`` (this replica's lookup stores, following the shared ``store``), ``auth`` /
``middleware`` (API keys -> namespaces, admission by phase, body limit, request counts),
``unknown_fields`` (bounded logging of unknown request fields), ``metrics``, ``errors``, ``config``.
Nothing is imported here, so ``lookupspec.store`` stays importable without FastAPI or torch.
"""
