"""HTTP gateway (FastAPI). Installed as lookupspec.gateway."""
