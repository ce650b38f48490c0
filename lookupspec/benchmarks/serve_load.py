"""The closed loop of ``bench-serve``: which requests a level sends, in which order the passes run,
what each request's body is, one timed pass, the sweep, and the /metrics scrapes around each pass.

A *pass* is one concurrency level in one mode: ``on`` / ``off`` (lookupspec with speculation on or
off) or ``server`` (another server, its own settings). Against lookupspec the two modes of a level
run back to back, and their order flips from one level to the next (``pass_order``), so neither
mode always runs first on a machine whose load drifts. They are separate passes, not requests mixed
in one pass, because a mixed batch is neither mode's regime and the server's counters could not
tell the modes apart.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lookupspec.benchmarks.http_client import StreamedResponse, bearer, stream_chat
from lookupspec.benchmarks.prompts import BenchPrompt
from lookupspec.benchmarks.serve_report import response_record, summarize_pass
from lookupspec.benchmarks.validity import Checker, output_checker

__all__ = ["LoadSettings", "Target", "closed_loop", "cpu_times", "level_requests", "parse_metrics",
           "pass_label", "pass_labels", "pass_order", "request_body", "steal_fraction", "sweep"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Target:
    """The server under test."""

    url: str
    model: str  # the `model` of every request
    lookupspec: bool  # speculation on/off passes, `lookup` fields and /metrics
    headers: Mapping[str, str] = field(default_factory=dict)
    # pass label (``pass_label``) -> the bearer key its requests carry, for a server started with one
    # key, so one namespace, per pass: no pass finds prompts an earlier one left in the prefix cache
    pass_keys: Mapping[str, str] = field(default_factory=dict)

    def pass_headers(self, label: str) -> dict[str, str]:
        """The headers added to the client's for the requests of the pass ``label``."""
        return bearer(self.pass_keys.get(label))


def pass_label(level: int | None, mode: str) -> str:
    """A pass's name in ``Target.pass_keys``; ``level`` None: the warm-up of ``mode``.
    Example: (8, "on") -> "8-on"; (None, "off") -> "warmup-off"."""
    return f"{'warmup' if level is None else level}-{mode}"


def pass_labels(settings: LoadSettings) -> list[str]:
    """Every label a sweep with ``settings`` uses: the warm-ups, then the passes in run order."""
    return ([pass_label(None, m) for m in settings.modes]
            + [pass_label(level, m) for level, m in pass_order(settings.levels, settings.modes)])


@dataclass(frozen=True)
class LoadSettings:
    levels: tuple[int, ...]
    modes: tuple[str, ...]  # "on", "off" for lookupspec; ("server",) otherwise
    max_tokens: int = 128
    requests: int | None = None  # per level; None: every prompt once, at least one per stream
    sources: tuple[str, ...] | None = ("context",)  # lookup sources when on; None: the server's default
    # uncounted requests per mode, sent at once before the sweep; None: as many as the largest level
    warmup: int | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if not self.levels or min(self.levels) < 1:
            raise ValueError(f"concurrency levels must be >= 1, got {self.levels}")
        if not self.modes:
            raise ValueError("no modes to run")

    @property
    def warmup_requests(self) -> int:
        """The warm-up's requests per mode. By default the largest level's: a server sizes what it
        keeps per sequence (lookupspec's KV pool, by doubling) for the most sequences it has held, and
        a pass that first reaches a count would pay that growth inside its measured time (under a
        hypervisor, fresh memory's first touch can take seconds of a pass)."""
        return max(self.levels) if self.warmup is None else self.warmup


def level_requests(prompts: Sequence[BenchPrompt], level: int, requests: int | None) -> list[BenchPrompt]:
    """The requests of one level: ``requests`` (default max(len(prompts), level)) prompts, cycled.
    Example: prompts a b c at level 4 -> a b c a."""
    n = requests if requests is not None else max(len(prompts), level)
    return [prompts[i % len(prompts)] for i in range(n)]


def warmup_prompts(prompts: Sequence[BenchPrompt], count: int) -> list[BenchPrompt]:
    """A mode's warm-up: ``count`` prompts as a level of ``count`` would send them, the set's longest
    (in characters) among them. lookupspec's KV pool doubles what it keeps per sequence for the
    longest sequence it has held, copying every slot while all streams wait, so the warm-up must
    hold that one: otherwise the first pass to meet it pays the growth (seconds, for 8 slots grown to
    2,048 positions).
    Example: prompts a bb c, count 2 -> a bb; prompts a b ccc, count 2 -> a ccc."""
    warm = level_requests(prompts, count, count)
    longest = max(prompts, key=lambda p: sum(len(m["content"]) for m in p.messages))
    if warm and longest not in warm:
        warm[-1] = longest
    return warm


def pass_order(levels: Sequence[int], modes: Sequence[str]) -> list[tuple[int, str]]:
    """(level, mode) passes in run order: the modes back to back per level, their order reversed at
    every other level. Example: levels 1, 4 and modes on, off -> (1, on), (1, off), (4, off), (4, on)."""
    out: list[tuple[int, str]] = []
    for i, level in enumerate(levels):
        out.extend((level, m) for m in (modes if i % 2 == 0 else list(reversed(modes))))
    return out


def request_body(target: Target, settings: LoadSettings, prompt: BenchPrompt, mode: str,
                 max_tokens: int | None = None) -> dict[str, Any]:
    """A greedy streamed chat request, with the prompt's ``response_format`` if it has one; lookupspec's
    ``lookup`` field only for lookupspec (other servers may refuse unknown fields: ``transformers
    serve`` answers 422). ``extra_body`` goes last."""
    body: dict[str, Any] = {"model": target.model, "messages": [dict(m) for m in prompt.messages],
                            "max_tokens": max_tokens or settings.max_tokens, "temperature": 0,
                            "stream_options": {"include_usage": True}}
    if prompt.response_format is not None:
        body["response_format"] = prompt.response_format
    if target.lookupspec and mode == "off":
        body["lookup"] = {"enabled": False}
    elif target.lookupspec and mode == "on":
        body["lookup"] = {"enabled": True}
        if settings.sources is not None:
            body["lookup"]["sources"] = list(settings.sources)
    return {**body, **settings.extra_body}


async def closed_loop(items: Sequence[T], concurrency: int,
                      send: Callable[[int, int, T], Awaitable[R]]) -> list[R]:
    """Closed-loop load: ``concurrency`` clients share one iterator over ``items``; each awaits
    ``send(client, index, item)`` and takes the next item as soon as it returns, until none is left.
    Results come back in item order. Example: 2 clients, items a b c, a slow: client 0 sends a while
    client 1 sends b, then c; a third request is never in flight."""
    queue = iter(enumerate(items))
    results: dict[int, R] = {}

    async def client(c: int) -> None:
        for i, item in queue:  # one iterator shared by all clients (one event loop: no lock needed)
            results[i] = await send(c, i, item)

    await asyncio.gather(*(client(c) for c in range(min(concurrency, len(items)))))
    return [results[i] for i in range(len(items))]


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as ``{'name{labels}': value}`` (``_created`` samples dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if name and not name.split("{", 1)[0].endswith("_created"):
            out[name] = float(value)
    return out


async def _idle_metrics(http: Any, timeout: float = 30.0) -> dict[str, float]:
    """/metrics once the server runs and queues nothing, so the counters include the last step."""
    deadline = time.monotonic() + timeout
    while True:
        m = parse_metrics((await http.get("/metrics")).text)
        busy = m.get("lookupspec_num_requests_running", 0) + m.get("lookupspec_num_requests_waiting", 0)
        if not busy or time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.05)


async def _send(http: Any, body: dict[str, Any], headers: Mapping[str, str]) -> StreamedResponse:
    import httpx

    sent = time.perf_counter()
    try:
        return await stream_chat(http, body, headers=headers)
    except httpx.HTTPError as exc:
        return StreamedResponse(sent=sent, finished=time.perf_counter(),
                                http_error=f"{type(exc).__name__}: {exc}")


def cpu_times(stat: str | None = None) -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from ``/proc/stat`` (or its text ``stat``); None where the
    file or its steal column is missing. Steal is time the hypervisor gave this guest's CPUs to
    others: on a shared virtual machine it is what a pass slowed by a neighbour shows."""
    if stat is None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                stat = f.readline()
        except OSError:
            return None
    fields = stat.split("\n", 1)[0].split()
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[7], sum(ticks)


def steal_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the CPU time between two :func:`cpu_times` readings that the host stole."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 4)


async def _run_pass(http: Any, target: Target, settings: LoadSettings, level: int, mode: str,
                    prompts: Sequence[BenchPrompt], count_tokens: Callable[[str], int] | None,
                    checks: Mapping[str, Checker | None]) -> dict[str, Any]:
    reqs = level_requests(prompts, level, settings.requests)
    before = await _idle_metrics(http) if target.lookupspec else None
    started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    headers = target.pass_headers(pass_label(level, mode))
    cpu0 = cpu_times()
    t0 = time.perf_counter()

    async def send(client: int, _: int, p: BenchPrompt) -> tuple[int, StreamedResponse]:
        return client, await _send(http, request_body(target, settings, p, mode), headers)

    results = await closed_loop(reqs, level, send)
    wall = max(r.finished or r.sent for _, r in results) - t0
    steal = steal_fraction(cpu0, cpu_times())
    after = await _idle_metrics(http) if target.lookupspec else None
    delta = None if before is None or after is None else {k: v - before.get(k, 0.0) for k, v in after.items()}
    records = [response_record(r, p, c, t0, count_tokens, checks.get(p.id))
               for p, (c, r) in zip(reqs, results, strict=True)]
    return {"level": level, "mode": mode, "started": started, "wall_s": round(wall, 4),
            "summary": {"level": level, "mode": mode, **summarize_pass(records, wall, delta),
                        "host_steal": steal},
            "responses": records}


async def _compile_formats(http: Any, target: Target, settings: LoadSettings,
                           prompts: Sequence[BenchPrompt]) -> None:
    """One uncounted one-token request per distinct response_format of the set, one after another: a
    server compiles a schema's grammar on first use (seconds, at a 49k vocabulary) and keeps it, so no
    measured pass pays for it, whichever mode runs first (measured: steady state, a fixed set of
    schemas)."""
    seen: set[str] = set()
    mode = settings.modes[0]
    headers = target.pass_headers(pass_label(None, mode))
    for p in prompts:
        key = json.dumps(p.response_format, sort_keys=True)
        if p.response_format is None or key in seen:
            continue
        seen.add(key)
        r = await _send(http, request_body(target, settings, p, mode, max_tokens=1), headers)
        if r.error is not None:
            raise RuntimeError(f"warm-up request failed ({p.id}, response_format): {r.error}")


def mode_label(mode: str) -> str:
    return {"on": "speculation on", "off": "speculation off"}.get(mode, "server default")


async def sweep(target: Target, settings: LoadSettings, prompts: Sequence[BenchPrompt],
                count_tokens: Callable[[str], int] | None = None,
                transport: Any = None) -> list[dict[str, Any]]:
    """Warm up, then every pass of ``pass_order``; the passes with their summaries and responses.
    Raises ``RuntimeError`` when a warm-up request fails (a wrong model name, a bad source ...).
    ``transport``: an ``httpx`` transport instead of the network (tests)."""
    import httpx

    checks = {p.id: output_checker(p.response_format) for p in prompts}  # validated by the caller
    most = max(settings.levels) + 4
    limits = httpx.Limits(max_connections=most, max_keepalive_connections=most)
    async with httpx.AsyncClient(base_url=target.url, headers=dict(target.headers), limits=limits,
                                 timeout=httpx.Timeout(settings.timeout_s, connect=30.0),
                                 transport=transport) as http:
        for mode in settings.modes:
            warm = warmup_prompts(prompts, settings.warmup_requests)
            # as long as the measured requests: the server's averages (the step-cost model, the chunk
            # budget's steps per sequence) then start from requests like them, not from short ones
            bodies = [request_body(target, settings, p, mode) for p in warm]
            headers = target.pass_headers(pass_label(None, mode))
            for r in await asyncio.gather(*(_send(http, b, headers) for b in bodies)):
                if r.error is not None:
                    raise RuntimeError(f"warm-up request failed ({mode_label(mode)}): {r.error}")
        await _compile_formats(http, target, settings, prompts)
        passes = []
        for level, mode in pass_order(settings.levels, settings.modes):
            n = len(level_requests(prompts, level, settings.requests))
            _log(f"concurrency {level}, {mode_label(mode)}: {n} requests ...")
            passes.append(await _run_pass(http, target, settings, level, mode, prompts, count_tokens, checks))
            s = passes[-1]["summary"]
            stolen = ("" if s["host_steal"] is None
                      else f", {100 * s['host_steal']:.1f}% of CPU time stolen by the host")
            valid = f", {s['valid']}/{s['checked']} valid" if s["checked"] else ""
            _log(f"  {s['output_tokens_per_s']:.1f} output tok/s, {s['errors']} errors{valid}, "
                 f"{s['wall_s']:.1f} s{stolen}")
    return passes


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
