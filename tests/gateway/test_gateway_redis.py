"""Two gateway replicas sharing one real Redis: cross-replica visibility, replay on restart, and a Redis
outage in the middle of a load run (nothing fails, nothing is lost, the replicas converge)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from gateway_harness import MODEL, Gateway, start_all
from redis_harness import RedisServer
from reference import complete

pytestmark = [pytest.mark.slow, pytest.mark.redis]


@dataclass
class Cluster:
    redis: RedisServer
    a: Gateway
    b: Gateway


@pytest.fixture(scope="module")
def cluster(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory,
            tiny_model: Path) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("replicas")
    args = ["--redis-url", redis_server.url, "--redis-prefix", "gwtest:"]
    a = Gateway(tiny_model, base / "a", name="a", args=args)
    b = Gateway(tiny_model, base / "b", name="b", args=args)
    start_all(a, b)
    yield Cluster(redis_server, a, b)
    for g in (a, b):
        g.stop()


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def upload(client: httpx.Client, collection: str, docs: list[tuple[str, str]]) -> dict:
    r = client.post(f"/v1/collections/{collection}/documents",
                    json={"documents": [{"id": i, "text": t} for i, t in docs]})
    assert r.status_code == 200, r.text
    return r.json()


def doc_ids(client: httpx.Client, collection: str) -> set[str]:
    r = client.get(f"/v1/collections/{collection}")
    return {d["id"] for d in r.json()["documents"]} if r.status_code == 200 else set()


def ids_on(gateway: Gateway, collection: str) -> set[str]:
    with gateway.client() as c:
        return doc_ids(c, collection)


def converged(*gateways: Gateway) -> bool:
    healths = [g.health(digest="true") for g in gateways]
    return all(h["store"]["state"] == "ok" and h["store"]["buffered"] == 0 and h["store"]["caught_up"]
               for h in healths) and len({h["digest"] for h in healths}) == 1


def test_a_collection_written_through_a_is_visible_on_b_within_a_second(cluster: Cluster) -> None:
    with cluster.a.client() as ca, cluster.b.client() as cb:
        ack = upload(ca, "kb", [("d1", "Replicas share documents through Redis streams.")])
        t0 = time.monotonic()
        assert ack["buffered"] is False
        assert wait_until(lambda: cb.get("/v1/collections/kb/documents/d1").status_code == 200, 1.0)
        assert time.monotonic() - t0 < 1.0
        r = cb.post("/v1/completions", json={"model": MODEL, "prompt": "Replicas share", "max_tokens": 8,
                                             "lookup": {"collections": ["kb"]}})
        assert r.status_code == 200, r.text


def test_b_drafts_from_a_collection_written_through_a(cluster: Cluster, text_engine) -> None:
    prompt = text_engine.encode_prompt(prompt="Cross-replica drafting: replica B reads")
    expected = complete(text_engine, prompt_ids=prompt, max_tokens=48, temperature=0.0)
    text = text_engine.tokenizer.decode(prompt) + expected.text
    with cluster.a.client() as ca, cluster.b.client() as cb:
        upload(ca, "kb-draft", [("source", text)])
        assert wait_until(lambda: cb.get("/v1/collections/kb-draft").status_code == 200, 1.0)
        r = cb.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 48,
                                             "temperature": 0,
                                             "lookup": {"collections": ["kb-draft"], "sources": ["corpus"]}})
        body = r.json()
        assert body["choices"][0]["text"] == expected.text
        assert body["speculation"]["accepted_tokens_by_source"].get("corpus", 0) > 0
        assert body["speculation"]["source_shares"].get("corpus", 0) > 0


def test_b_restarted_replays_everything(cluster: Cluster) -> None:
    with cluster.a.client() as ca:
        upload(ca, "replay", [(f"r{i}", f"replayed document number {i}") for i in range(20)])
        upload(ca, "replay-other", [("d1", "a second collection written before the restart")])
        ca.post("/v1/completions", json={"model": MODEL, "prompt": "output before restart", "max_tokens": 6})
        assert cluster.b.stop() == 0  # SIGTERM: drained, exit status 0
        # written while B is down: B must get it from the stream when it starts again
        upload(ca, "replay", [("late", "written while replica B was down")])
        ca.delete("/v1/collections/replay/documents/r0")
    cluster.b.start().wait_ready()
    assert wait_until(lambda: converged(cluster.a, cluster.b), 10.0, 0.1)
    with cluster.b.client() as cb:
        assert doc_ids(cb, "replay") == {f"r{i}" for i in range(1, 20)} | {"late"}
        assert cb.get("/v1/collections/replay-other/documents/d1").status_code == 200
    assert cluster.b.health()["store"]["outputs"] == cluster.a.health()["store"]["outputs"] >= 1


def test_redis_outage_during_load_fails_nothing_loses_nothing_and_converges(cluster: Cluster) -> None:
    gateways = (cluster.a, cluster.b)
    with cluster.a.client() as ca:
        upload(ca, "load", [("seed", "the seed document of the load run")])
    assert wait_until(lambda: all(ids_on(g, "load") for g in gateways), 2.0)

    failures: list[str] = []
    acknowledged: list[str] = []
    buffered_acks: list[str] = []
    progress = {"ops": 0}
    lock = threading.Lock()

    def worker(w: int) -> None:
        clients = [g.client(timeout=60) for g in gateways]
        try:
            for i in range(24):
                client = clients[(w + i) % 2]
                if i % 3 == 0:
                    doc_id = f"w{w}-{i}"
                    r = client.post("/v1/collections/load/documents",
                                    json={"documents": [{"id": doc_id, "text": f"load document {w} {i}"}]})
                    if r.status_code == 200:
                        with lock:
                            acknowledged.append(doc_id)
                            if r.json()["buffered"]:
                                buffered_acks.append(doc_id)
                elif i % 3 == 1:
                    r = client.post("/v1/completions", json={"model": MODEL, "prompt": f"load {w} {i}",
                                                             "max_tokens": 4,
                                                             "lookup": {"collections": ["load"]}})
                else:
                    r = client.post("/v1/chat/completions", json={
                        "model": MODEL, "messages": [{"role": "user", "content": f"load {w} {i}"}],
                        "max_tokens": 4, "stream": True})
                    if r.status_code == 200 and not r.text.endswith("data: [DONE]\n\n"):
                        failures.append(f"stream of {w}/{i} did not end with [DONE]")
                if r.status_code != 200:
                    failures.append(f"{r.request.url.path}: {r.status_code} {r.text[:200]}")
                with lock:
                    progress["ops"] += 1
                time.sleep(0.02)
        finally:
            for c in clients:
                c.close()

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(worker, w) for w in range(4)]
        assert wait_until(lambda: progress["ops"] >= 20, 60.0)
        cluster.redis.stop()
        degraded_seen = wait_until(lambda: all(g.health()["status"] == "degraded" for g in gateways),
                                   10.0, 0.05)
        metrics_during = cluster.a.metrics()
        assert wait_until(lambda: progress["ops"] >= 60, 60.0)
        cluster.redis.start()
        for f in futures:
            f.result()

    assert not failures, failures
    assert degraded_seen, "the replicas never reported the outage in /health"
    assert metrics_during['lookupspec_store_healthy{backend="redis"}'] == 0.0
    assert buffered_acks, "no write was acknowledged while Redis was down: the outage came too late"
    assert wait_until(lambda: converged(*gateways), 20.0, 0.1), [g.health() for g in gateways]
    for g in gateways:
        assert ids_on(g, "load") == {"seed", *acknowledged}
    outputs = {g.health()["store"]["outputs"] for g in gateways}
    assert len(outputs) == 1
