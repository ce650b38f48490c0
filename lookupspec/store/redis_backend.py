"""Redis backend: Redis streams as the log every replica shares.

Keys (``key_prefix`` default ``lookupspec:``)::

    {prefix}{log}:documents   add/delete document, delete collection; uncapped by default
    {prefix}{log}:outputs     append output; capped at ``stream_maxlen`` (approximate MAXLEN ~)

(The ``{log}`` hash tag keeps both streams in one cluster slot, so one XREAD can follow both.)
Documents and outputs are separate streams because they need different caps: trimming the documents
stream would silently remove documents from every replica that starts later, while outputs are a
cache whose oldest entries may go.

Each entry holds the whole encoded record (one binary field ``r``; ``records.py`` encoding, token ids
as raw int32 bytes) rather than a key to a separate payload. One XADD is then atomic: no entry can
point at a payload that was never written or already expired, trimming the stream frees its
payloads with it, and replay is one XRANGE page per round trip instead of one extra GET per record.
Documents are bounded by the API's size limits, far below Redis's 512 MB value limit.

Acknowledged means one of two things, told apart by ``AppendAck.buffered``:

- written to Redis (XADD returned its entry id); durable as far as Redis's own persistence goes
  (configure AOF if a Redis restart must not lose entries); or
- Redis unreachable: accepted into this replica's bounded in-memory buffer, applied locally, and
  written by a background thread once Redis returns (oldest first). A graceful stop before that
  spills the buffer to ``spill_dir`` (``spill.py``), and the next replica started on that directory
  takes it over; so only a kill -9 during an outage can lose it.

Lookups never wait on Redis, and neither do appends once an outage is known: only while the backend
still believes Redis healthy does ``append`` send an XADD, bounded by ``socket_timeout``; its first
failure flips the backend to degraded and from then on appends go straight to the buffer until the
flusher has emptied it. Documents (adds and deletes) and outputs have separate buffers with their
own limits (``buffer_limit``, ``output_buffer_limit``): outputs are a cache that every generation
appends to, and must never crowd out a document upload. The flusher writes documents first. When a
buffer is full the *newest* record is rejected with ``BufferFullError`` (counted as ``overflow``):
every buffered record was already acknowledged, so dropping the oldest would break a promise
silently, while a rejected append is an honest error the caller can report or retry (the gateway
drops a rejected output, answers a rejected upload with 503). (Batches in flight when Redis failed
are buffered even past the limit: they may have reached Redis already, so they cannot be reported
as rejected.)

Every replica replays both streams at start-up (XRANGE in pages) and then follows them with blocking
XREAD from a background thread, reconnecting with exponential backoff; after an outage the same XREAD
cursor catches up on what other replicas wrote meanwhile. ``health()["synced"]`` turns true once the
replica has read both streams to their end (the replay, or the follower when Redis was down at
start-up) and stays true: a replica that started during an outage has not got the shared state yet.
Records from all replicas, its own included, go to ``apply``; ``StoreState.apply`` dedupes by record
id, so the effect is exactly once even though a retried XADD may leave a duplicate entry in the
stream.

Compaction of the documents stream. Replacing a document leaves its old entry in the stream, so under
churn the stream (and every later replica's replay) grows without bound while the live state does not.
When the stream holds at least ``compact_min_records`` entries and more than ``compact_ratio`` times
the live document records, a replica writes a snapshot and trims the stream behind it:

- the snapshot is ``StoreState.live_records`` (documents only) taken after the replica has applied
  every entry up to its cursor ``cut``, so it covers every entry <= ``cut``;
- one Lua script (atomic) stores it in the hash ``{prefix}{log}:snapshot`` (``cut``, ``chunks``,
  ``data:i``: encoded record frames) and runs ``XTRIM MINID cut``, and does neither when a snapshot
  with a newer cut is there already (two replicas compacting at once);
- a replica starting later loads the snapshot, then reads the stream after ``cut``; a replica that
  reads from a cursor older than the snapshot's cut (lagging, back from an outage, or racing a
  compaction during its replay) sees it when it checks the cut after each read, and applies the
  snapshot before going on. Applying is idempotent and order-independent (``state.py``), so a snapshot
  applied over a state that has some of its records, or newer ones, converges all the same.

Records buffered during an outage are written later with new (newer) entry ids, so a trim never
removes them. The outputs stream is not compacted: it is capped (``stream_maxlen``), as a cache.

Needs Redis >= 6.2 (exclusive XRANGE bounds, XTRIM MINID). redis-py runs with its own retries off: this module
retries with backoff off the request path instead.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .base import AppendAck, ApplyFn, BufferFullError, StoreClosedError
from .embedded import encode_frame, read_frame
from .records import AppendOutput, Record, RecordError, decode_record, encode_record
from .spill import SpillDir, TakenOver

__all__ = ["RedisConfig", "RedisLog"]

log = logging.getLogger(__name__)

_FIELD = b"r"
_FLUSH_BATCH = 256
_SNAPSHOT_CHUNK = 64 * 2**20  # bytes per hash field of the snapshot (Redis values stop at 512 MB)

# KEYS: snapshot hash, documents stream. ARGV: cut (an entry id), then the snapshot's chunks.
# Stores the snapshot and trims the stream behind it, unless a snapshot with a newer cut exists.
_COMPACT_LUA = """
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local cur = redis.call('HGET', KEYS[1], 'cut')
if cur then
  local am, as = parse(ARGV[1])
  local bm, bs = parse(cur)
  if am < bm or (am == bm and as <= bs) then return 0 end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'cut', ARGV[1], 'chunks', #ARGV - 1)
for i = 2, #ARGV do
  redis.call('HSET', KEYS[1], 'data:' .. (i - 2), ARGV[i])
end
redis.call('XTRIM', KEYS[2], 'MINID', ARGV[1])
return 1
"""


def _entry_key(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True)
class RedisConfig:
    url: str
    key_prefix: str = "lookupspec:"
    stream_maxlen: int | None = 100_000  # cap of the outputs stream; None = uncapped
    doc_stream_maxlen: int | None = None  # cap of the documents stream; capping it loses documents
    buffer_limit: int = 10_000  # document records held while Redis is unreachable
    output_buffer_limit: int = 1_000  # output records held while Redis is unreachable (separately)
    spill_dir: Path | None = None  # where a graceful stop leaves still-buffered records (spill.py)
    socket_timeout: float = 0.25  # seconds a request-path XADD may wait while Redis looks healthy
    connect_timeout: float = 0.25
    block_ms: int = 500  # XREAD BLOCK; also bounds how long stop() waits for the follower
    page_size: int = 500  # entries per XRANGE / XREAD round trip
    backoff_initial: float = 0.05  # reconnect backoff, doubled per failure up to backoff_max
    backoff_max: float = 2.0
    compact_min_records: int = 10_000  # no compaction of the documents stream below this many entries
    compact_ratio: float = 2.0  # compact when it holds more than ratio x the live records; 0: never
    compact_check_s: float = 1.0  # at most one length check (XLEN) per this many seconds

    def __post_init__(self) -> None:
        if not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis url must start with redis://, rediss:// or unix://, got {self.url!r}")
        if not self.key_prefix:
            raise ValueError("key_prefix must not be empty")
        for name in ("stream_maxlen", "doc_stream_maxlen"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be None or >= 1, got {value}")
        if self.buffer_limit < 0 or self.output_buffer_limit < 0:
            raise ValueError(f"buffer_limit and output_buffer_limit must be >= 0, got {self.buffer_limit} "
                             f"and {self.output_buffer_limit}")
        if self.socket_timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("socket_timeout and connect_timeout must be > 0")
        if self.block_ms < 1 or self.page_size < 1:
            raise ValueError("block_ms and page_size must be >= 1")
        if not 0 < self.backoff_initial <= self.backoff_max:
            raise ValueError("need 0 < backoff_initial <= backoff_max")
        if self.compact_min_records < 1 or not (self.compact_ratio == 0 or self.compact_ratio > 1):
            raise ValueError(f"need compact_min_records >= 1 and compact_ratio 0 (off) or > 1, got "
                             f"{self.compact_min_records} and {self.compact_ratio}")

    @property
    def documents_key(self) -> str:
        return f"{self.key_prefix}{{log}}:documents"

    @property
    def outputs_key(self) -> str:
        return f"{self.key_prefix}{{log}}:outputs"

    @property
    def snapshot_key(self) -> str:
        return f"{self.key_prefix}{{log}}:snapshot"


class RedisLog:
    """See the module docstring. Thread-safe."""

    def __init__(self, config: RedisConfig) -> None:
        self.config = config
        no_retry = Retry(NoBackoff(), 0)  # we retry ourselves, with backoff, off the request path
        self._write_pool = redis.ConnectionPool.from_url(
            config.url, socket_timeout=config.socket_timeout,
            socket_connect_timeout=config.connect_timeout, retry=no_retry)
        self._read_pool = redis.ConnectionPool.from_url(
            config.url, socket_timeout=config.block_ms / 1000 + max(1.0, config.socket_timeout),
            socket_connect_timeout=config.connect_timeout, retry=no_retry)
        self._writer = redis.Redis(connection_pool=self._write_pool)
        self._reader = redis.Redis(connection_pool=self._read_pool)
        self._keys = (config.documents_key, config.outputs_key)
        self._cursor = dict.fromkeys(self._keys, b"0-0")  # last entry id read per stream
        self._applied_cursor = b"0-0"  # documents: every entry up to it is applied (compaction's cut)
        self._snapshot_source: Callable[..., list[Record]] | None = None
        self._live_count: Callable[..., int] = lambda **_: 0
        self._compact_script = self._writer.register_script(_COMPACT_LUA)
        self._last_compact_check = 0.0
        self.compactions = 0  # snapshots this replica wrote
        self.snapshots_loaded = 0

        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the flusher waits on it
        # per stream (documents first: the flusher's order): (stream key, MAXLEN cap, payload), oldest first
        self._buffers: dict[str, collections.deque[tuple[str, int | None, bytes]]] = {
            key: collections.deque() for key in self._keys}
        self._limits = {config.documents_key: config.buffer_limit,
                        config.outputs_key: config.output_buffer_limit}
        self._spill = None if config.spill_dir is None else SpillDir(config.spill_dir, config.key_prefix)
        self._taken = TakenOver()  # spill files taken over at start-up, deleted once flushed
        self._taken_pending = dict.fromkeys(self._keys, 0)  # their records still at the buffers' heads
        self._synced = False  # read both streams to their end at least once
        self._write_ok = True  # optimistic until an XADD fails
        self._read_ok = True
        self._behind_since: float | None = time.monotonic()  # None once caught up with the streams
        self._stop = threading.Event()
        self._closed = False
        self._follower: threading.Thread | None = None
        self._flusher: threading.Thread | None = None

        self.appended = 0  # acknowledged by Redis directly
        self.buffered_total = 0  # acknowledged into the buffer
        self.flushed = 0
        self.overflow = 0
        self.delivered = 0  # entries handed to apply (replay + follow, all replicas)
        self.corrupt_records = 0
        self.apply_errors = 0
        self.outages = 0
        self.spilled = 0  # records written to a spill file at close
        self.recovered = 0  # records taken over from spill files at start-up
        self.last_error: str | None = None

    # ---- appends ----------------------------------------------------------------------------

    def _route(self, record: Record) -> tuple[str, int | None]:
        if isinstance(record, AppendOutput):
            return self.config.outputs_key, self.config.stream_maxlen
        return self.config.documents_key, self.config.doc_stream_maxlen

    def append(self, record: Record) -> AppendAck:
        """Acknowledge the record (module docstring): XADD when Redis is believed healthy and no
        older records wait in the buffer, else buffer it. Raises ``BufferFullError`` when the buffer
        is full (the record is then not in the log)."""
        return self.append_many([record])[0]

    def append_many(self, records: Sequence[Record]) -> list[AppendAck]:
        """Append a batch in one pipelined round trip, or buffer all of it. All or nothing: when the
        buffer cannot take the whole batch, none of it is accepted (``BufferFullError``)."""
        items = [(*self._route(record), encode_record(record)) for record in records]
        with self._lock:
            if self._closed:
                raise StoreClosedError("the redis log is closed")
            if not (self._write_ok and not self._buffered()):
                return self._enqueue(records, items)
        try:
            pipe = self._writer.pipeline(transaction=False)
            for key, maxlen, payload in items:
                pipe.xadd(key, {_FIELD: payload}, maxlen=maxlen, approximate=True)
            entry_ids: Any = pipe.execute()
        except redis.RedisError as exc:
            # Some entries may have been written, so rejecting the batch now could leave a
            # "failed" record in the log: it is buffered even past buffer_limit (the limit is
            # exceeded by at most the batches in flight when Redis failed). Entries written twice
            # are duplicates that apply ignores (same record id).
            with self._lock:
                self._write_failed(exc)
                return self._enqueue(records, items, force=True)
        with self._lock:
            self.appended += len(records)
        return [AppendAck(r.record_id, eid.decode()) for r, eid in zip(records, entry_ids, strict=True)]

    def _buffered(self) -> int:
        # caller holds self._lock
        return sum(len(b) for b in self._buffers.values())

    def _enqueue(self, records: Sequence[Record], items: list[tuple[str, int | None, bytes]],
                 force: bool = False) -> list[AppendAck]:
        # caller holds self._lock. All or nothing: a batch over either buffer's limit is rejected whole.
        if not force:
            for key, buffer in self._buffers.items():
                wanted = sum(1 for k, _, _ in items if k == key)
                if wanted and len(buffer) + wanted > self._limits[key]:
                    self.overflow += len(items)
                    kind = "document" if key == self.config.documents_key else "output"
                    raise BufferFullError(
                        f"redis unreachable and the {kind} append buffer is full ({len(buffer)} of "
                        f"{self._limits[key]} records); {len(items)} record(s) rejected")
        for item in items:
            self._buffers[item[0]].append(item)
        self.buffered_total += len(items)
        self._ensure_flusher()
        self._wake.notify()
        return [AppendAck(r.record_id, None, buffered=True) for r in records]

    def _write_failed(self, exc: Exception) -> None:
        # caller holds self._lock
        if self._write_ok:
            self.outages += 1
            log.warning("redis write failed, buffering appends: %s", exc)
        self._write_ok = False
        self.last_error = f"write: {type(exc).__name__}: {exc}"

    def _ensure_flusher(self) -> None:
        if self._flusher is None and not self._stop.is_set():
            self._flusher = threading.Thread(target=self._flush_loop, name="store-redis-flush", daemon=True)
            self._flusher.start()

    def _flush_loop(self) -> None:
        backoff = self.config.backoff_initial
        while not self._stop.is_set():
            with self._lock:
                while self._write_ok and not self._buffered() and not self._stop.is_set():
                    self._wake.wait()
            if self._stop.is_set():
                return
            if self._flush_once():
                backoff = self.config.backoff_initial
            else:
                self._stop.wait(backoff)
                backoff = min(2 * backoff, self.config.backoff_max)

    def _flush_once(self) -> bool:
        """Write the oldest buffered records, documents first (or PING when none); True on success."""
        with self._lock:
            key = next((k for k in self._keys if self._buffers[k]), self._keys[0])
            buffer = self._buffers[key]
            batch = list(itertools.islice(buffer, _FLUSH_BATCH))
        try:
            if batch:
                pipe = self._writer.pipeline(transaction=False)
                for key, maxlen, payload in batch:
                    pipe.xadd(key, {_FIELD: payload}, maxlen=maxlen, approximate=True)
                pipe.execute()
            else:
                self._writer.ping()
        except redis.RedisError as exc:
            # Some entries of the batch may have been written; resending them leaves duplicate
            # entries, which apply ignores (same record id).
            with self._lock:
                self._write_failed(exc)
            return False
        with self._lock:
            for _ in batch:  # appends only add on the right, so the batch is still the left end
                buffer.popleft()
            self.flushed += len(batch)
            self._taken_pending[key] = max(0, self._taken_pending[key] - len(batch))
            if self._taken.files and not any(self._taken_pending.values()):
                self._taken.release(delete=True)  # every taken-over record is in Redis now
            if not self._buffered() and not self._write_ok:
                self._write_ok = True
                log.warning("redis writes recovered; %d buffered records flushed", self.flushed)
        return True

    # ---- replay and follow ------------------------------------------------------------------

    def replay(self, apply: ApplyFn) -> int:
        """Take over spill files (their records are applied and buffered for Redis), then load the
        documents' snapshot and XRANGE both streams in pages from the start (the documents stream
        after the snapshot's cut). If Redis is unreachable, report degraded and return what was read:
        the follower resumes from the same cursor when Redis returns."""
        count = self._take_over_spills(apply)
        try:
            count += self._load_snapshot(apply)
            for key in self._keys:
                while True:
                    before = self._cursor[key]
                    start = b"-" if before == b"0-0" else b"(" + before
                    entries: Any = self._reader.xrange(key, min=start, max="+", count=self.config.page_size)
                    for entry_id, fields in entries:
                        self._deliver(apply, key, entry_id, fields)
                    count += len(entries)
                    if key == self.config.documents_key:
                        count += self._check_snapshot(apply, before)
                    if len(entries) < self.config.page_size:
                        break
        except redis.RedisError as exc:
            self._read_failed(exc)
            return count
        with self._lock:
            self._behind_since = None
            self._read_ok = True
            self._synced = True
        return count

    # ---- compaction (module docstring) --------------------------------------------------------

    def set_snapshot_source(self, live_records: Callable[..., list[Record]],
                            live_count: Callable[..., int]) -> None:
        """``StoreState.live_records`` and ``live_count``: what a compaction snapshots, and how many
        records that is (both called with ``outputs=False``)."""
        self._snapshot_source = live_records
        self._live_count = live_count

    def _check_snapshot(self, apply: ApplyFn, read_from: bytes) -> int:
        """After a read from ``read_from``: when a snapshot's cut is newer, the stream may have been
        trimmed under the read; apply the snapshot. Returns the records applied."""
        cut: Any = self._reader.hget(self.config.snapshot_key, "cut")
        if cut is None or _entry_key(cut) <= _entry_key(read_from):
            return 0
        return self._load_snapshot(apply)

    def _load_snapshot(self, apply: ApplyFn) -> int:
        """Apply the documents' snapshot, if any, and move the documents cursor up to its cut."""
        snap: Any = self._reader.hgetall(self.config.snapshot_key)
        if not snap or b"cut" not in snap:
            return 0
        cut: bytes = snap[b"cut"]
        data = b"".join(snap.get(f"data:{i}".encode(), b"") for i in range(int(snap.get(b"chunks", 0))))
        count, pos = 0, 0
        while pos < len(data):
            try:
                record, pos = read_frame(data, pos)
            except RecordError as exc:  # cannot happen short of a bug or a hand-edited key
                self.corrupt_records += 1
                self.last_error = f"snapshot {cut.decode()} damaged at byte {pos}: {exc}"
                log.error("store %s", self.last_error)
                break
            try:
                apply(record)
            except Exception:
                self.apply_errors += 1
                log.exception("applying a snapshot record failed")
            count += 1
        key = self.config.documents_key
        if _entry_key(cut) > _entry_key(self._cursor[key]):
            self._cursor[key] = cut
        if _entry_key(cut) > _entry_key(self._applied_cursor):
            self._applied_cursor = cut
        self.snapshots_loaded += 1
        log.info("store: applied the documents snapshot at %s (%d records)", cut.decode(), count)
        return count

    def _maybe_compact(self) -> None:
        """From the follower: snapshot and trim the documents stream when it is due."""
        cfg = self.config
        now = time.monotonic()
        if (not cfg.compact_ratio or self._snapshot_source is None
                or now - self._last_compact_check < cfg.compact_check_s):
            return
        self._last_compact_check = now
        cut = self._applied_cursor  # read before the snapshot: every entry up to it is in the state
        length: Any = self._reader.xlen(cfg.documents_key)
        if length < cfg.compact_min_records or cut == b"0-0":
            return
        if length <= cfg.compact_ratio * self._live_count(outputs=False):
            return
        records = self._snapshot_source(outputs=False)
        data = b"".join(encode_frame(encode_record(r)) for r in records)
        chunks = [data[i:i + _SNAPSHOT_CHUNK] for i in range(0, len(data), _SNAPSHOT_CHUNK)] or [b""]
        started = time.perf_counter()
        done = self._compact_script(keys=[cfg.snapshot_key, cfg.documents_key], args=[cut, *chunks])
        if done:
            self.compactions += 1
            log.info("store: documents stream compacted at %s: %d entries -> snapshot of %d records "
                     "(%d bytes) in %.2f s", cut.decode(), length, len(records), len(data),
                     time.perf_counter() - started)

    def _take_over_spills(self, apply: ApplyFn) -> int:
        """Records a replica spilled at a graceful stop during an outage: acknowledged, so applied
        here and written to Redis by the flusher (which deletes the files once they are all there)."""
        if self._spill is None:
            return 0
        taken = self._spill.take_over()
        if not taken.files:
            return 0
        for record in taken.records:
            try:
                apply(record)
            except Exception:
                self.apply_errors += 1
                log.exception("applying a spilled record failed")
        with self._lock:
            self._taken = taken
            items = [(*self._route(r), encode_record(r)) for r in taken.records]
            for key in self._keys:
                self._taken_pending[key] = sum(1 for k, _, _ in items if k == key)
            self.recovered += len(items)
            if items:
                self._enqueue(taken.records, items, force=True)
            else:
                taken.release(delete=True)
        log.warning("took over %d buffered record(s) spilled by a stopped replica (%d file(s))",
                    len(items), len(taken.files))
        return len(items)

    def _deliver(self, apply: ApplyFn, key: str, entry_id: bytes, fields: Any) -> None:
        self._cursor[key] = entry_id
        try:
            record = decode_record(fields.get(_FIELD, b""))
        except RecordError as exc:
            self.corrupt_records += 1
            self.last_error = f"entry {entry_id.decode()} of {key} skipped: {exc}"
            log.warning("store stream %s", self.last_error)
            return
        self.delivered += 1
        try:
            apply(record)
        except Exception as exc:
            # A bug in apply must not kill the follower; the cursor already moved past the entry,
            # so one bad record cannot wedge the log.
            self.apply_errors += 1
            self.last_error = f"applying entry {entry_id.decode()} of {key} failed: {exc!r}"
            log.exception("store stream: applying %s failed", entry_id.decode())
        if key == self.config.documents_key:
            self._applied_cursor = entry_id  # after apply: what a compaction may cut at

    def _read_failed(self, exc: Exception) -> None:
        with self._lock:
            if self._read_ok:
                self.outages += 1
                log.warning("redis read failed, serving local state: %s", exc)
            self._read_ok = False
            if self._behind_since is None:
                self._behind_since = time.monotonic()
            self.last_error = f"read: {type(exc).__name__}: {exc}"

    def start_following(self, apply: ApplyFn) -> None:
        if self._follower is not None:
            raise RuntimeError("already following")
        self._follower = threading.Thread(target=self._follow_loop, args=(apply,),
                                          name="store-redis-follow", daemon=True)
        self._follower.start()

    def _follow_loop(self, apply: ApplyFn) -> None:
        backoff = self.config.backoff_initial
        while not self._stop.is_set():
            full = False
            try:
                streams: Any = dict(self._cursor)
                resp: Any = self._reader.xread(streams, count=self.config.page_size,
                                               block=self.config.block_ms)
                for key, entries in resp.items() if isinstance(resp, dict) else (resp or []):  # RESP3 / RESP2
                    key_str = key.decode() if isinstance(key, bytes) else key
                    for entry_id, fields in entries:
                        self._deliver(apply, key_str, entry_id, fields)
                    full |= len(entries) >= self.config.page_size
                self._check_snapshot(apply, streams[self.config.documents_key])
                self._maybe_compact()
            except redis.RedisError as exc:
                self._read_failed(exc)
                self._stop.wait(backoff)
                backoff = min(2 * backoff, self.config.backoff_max)
                continue
            backoff = self.config.backoff_initial
            with self._lock:
                if not self._read_ok:
                    log.warning("redis reads recovered")
                self._read_ok = True
                if full:  # more may be waiting: not caught up yet
                    self._behind_since = self._behind_since or time.monotonic()
                else:
                    self._behind_since = None
                    self._synced = True

    # ---- lifecycle ----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        with self._lock:
            following = self._follower is not None and not self._stop.is_set()
            buffered = self._buffered()
            ok = self._write_ok and not buffered and (self._read_ok or not following)
            return {
                "backend": "redis",
                "state": "ok" if ok else "degraded",
                # read both streams to their end at least once since start (see the module docstring)
                "synced": self._synced,
                "buffered": buffered,
                "buffered_documents": len(self._buffers[self.config.documents_key]),
                "buffered_outputs": len(self._buffers[self.config.outputs_key]),
                "buffer_limit": self.config.buffer_limit,
                "output_buffer_limit": self.config.output_buffer_limit,
                "overflow": self.overflow,
                "last_error": self.last_error,
                # how long this replica may have been missing other replicas' writes
                "lag_s": 0.0 if self._behind_since is None else time.monotonic() - self._behind_since,
                "caught_up": self._behind_since is None,
                "appended": self.appended,
                "buffered_total": self.buffered_total,
                "flushed": self.flushed,
                "delivered": self.delivered,
                "corrupt_records": self.corrupt_records,
                "apply_errors": self.apply_errors,
                "outages": self.outages,
                "spilled": self.spilled,
                "compactions": self.compactions,
                "snapshots_loaded": self.snapshots_loaded,
                "recovered_from_spill": self.recovered,
                "streams": list(self._keys),
            }

    def stop(self) -> None:
        """Stop the follower and the flusher; still-buffered records stay buffered (see close)."""
        self._stop.set()
        with self._lock:
            self._wake.notify_all()
        timeout = self.config.block_ms / 1000 + self.config.socket_timeout + 2.0
        for thread in (self._follower, self._flusher):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout)

    def close(self) -> None:
        """Stop, make one last attempt to flush the buffers (bounded by socket_timeout), spill what
        could not be written to ``spill_dir`` (without one: log it as lost), release connections.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.stop()
        while self._buffered() and self._flush_once():
            pass
        with self._lock:
            left = [payload for key in self._keys for _, _, payload in self._buffers[key]]
        if left and self._spill is not None:
            try:
                path = self._spill.write(left)
            except OSError as exc:
                log.error("closing with %d buffered records that never reached redis; spilling them to "
                          "%s failed: %s", len(left), self._spill.directory, exc)
            else:
                self.spilled = len(left)
                log.warning("redis unreachable at shutdown: %d buffered record(s) spilled to %s; the next "
                            "replica started with this data directory writes them", len(left), path)
        elif left:
            log.error("closing with %d buffered records that never reached redis", len(left))
        # The taken-over files' records reached Redis or are in the new spill file: either way done.
        self._taken.release(delete=not left or self.spilled > 0)
        self._write_pool.disconnect()
        self._read_pool.disconnect()
