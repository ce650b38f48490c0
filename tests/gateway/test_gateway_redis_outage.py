"""A replica and a Redis outage, through the real server: readiness of a replica that started while Redis
was down, output appends that must not crowd out document uploads, and writes acknowledged as
buffered that must survive a planned stop (SIGTERM) before Redis returns."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from gateway_harness import MODEL, Gateway
from redis_harness import RedisServer

from lookupspec.store import AddDocument, RedisConfig, RedisLog, Store

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def open_replica(redis: RedisServer, prefix: str) -> Store:
    store = Store(RedisLog(RedisConfig(redis.url, key_prefix=prefix)))
    store.start()
    return store


def serving(g: Gateway) -> bool:
    """The service is built (the replica answers /v1), whatever /ready says."""
    try:
        return httpx.get(g.url + "/health", timeout=5).json()["status"] != "loading"
    except httpx.HTTPError:
        return False


def test_outage_uploads_beside_outputs_a_planned_stop_and_a_restart_before_redis_returns(
        redis_server: RedisServer, gateways: Callable[..., Gateway]) -> None:
    """One replica through an outage: (1) generations keep appending outputs, which must not take the
    budget of document uploads; (2) a SIGTERM before Redis returns must not lose the upload that was
    acknowledged as buffered; (3) restarted while Redis is still down, the replica serves what it
    has (the spilled upload included) but is not ready: it has not read the shared log; (4) when
    Redis returns it catches up, becomes ready, and the spilled write reaches Redis."""
    prefix = "gwoutage:"
    with open_replica(redis_server, prefix) as seed:  # the shared log another replica wrote before
        seed.append_many([AddDocument("default", "kb", f"d{i}", f"document {i}", np.arange(3, dtype=np.int32))
                          for i in range(300)])
    g = gateways("outage", "--redis-url", redis_server.url, "--redis-prefix", prefix,
                 "--redis-buffer-limit", "2")
    g.start().wait_ready()
    redis_server.stop()
    try:
        with g.client() as c:
            for i in range(4):  # (1)
                r = c.post("/v1/completions", json={"model": MODEL, "prompt": f"during the outage {i}",
                                                    "max_tokens": 4})
                assert r.status_code == 200, r.text
            assert wait_until(lambda: g.health()["store"]["buffered_outputs"] == 4, 10), g.health()
            r = c.post("/v1/collections/kept/documents",
                       json={"documents": [{"id": "promise", "text": "acknowledged while Redis was down"}]})
            assert r.status_code == 200, r.text  # more outputs than the document budget (2) wait
            assert r.json()["buffered"] is True
        assert g.stop() == 0  # (2)
        assert len(list(g.data_dir.glob("spill-*.frames"))) == 1, g.log_tail()

        g.start()  # (3)
        assert wait_until(lambda: serving(g), 180), g.log_tail()
        ready = httpx.get(g.url + "/ready")
        assert (ready.status_code, ready.json()) == (503, {"status": "syncing"})
        assert "/ready answers 'syncing'" in g.log_tail()
        with g.client() as c:
            assert c.get("/v1/collections/kept/documents/promise").status_code == 200
            assert c.get("/v1/collections/kb").status_code == 404  # not read yet
    finally:
        redis_server.start()
    g.wait_ready(30)  # (4)
    with g.client() as c:
        assert c.get("/v1/collections/kb").json()["document_count"] == 300
    assert wait_until(lambda: not list(g.data_dir.glob("spill-*")), 10), "spill file not written to Redis"
    with open_replica(redis_server, prefix) as other:  # another replica reads it from Redis
        assert other.state.get_document("default", "kept", "promise") is not None
        assert len(other.state.outputs("default")) == 4
