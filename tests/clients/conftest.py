"""Fixtures for the client-side suites (lookupspec.client, the LangChain wrapper, the summarize job,
the RAG example): a real ``lookupspec serve`` subprocess on the tiny model, and an in-process client
on the same model, so both paths can be driven by the same tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_harness import MODEL, Gateway


@pytest.fixture(scope="session")
def tiny_model(tiny_models: dict[str, Path]) -> Path:
    return tiny_models[MODEL]


@pytest.fixture(scope="module")
def tiny_gateway(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A running gateway (no API keys, embedded store) shared by one test module."""
    gw = Gateway(tiny_model, tmp_path_factory.mktemp("gateway"), name="clients-gateway")
    gw.start().wait_ready()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def local_client(tiny_model: Path):
    """An in-process client on the gateway's model (its own engine and collections)."""
    from lookupspec.client import LocalClient

    return LocalClient.load(str(tiny_model))
