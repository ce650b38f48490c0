"""The shared store: documents, collections and output caches as an append-only log per deployment
(partitioned by namespace), and the in-memory state every replica builds from it.

Two backends behind one interface (``base.RecordLog``): the embedded log file (default, no
services) and Redis streams (``redis_url``). ``open_store`` picks one and returns a started
``Store``; index owners follow the state through ``Store.subscribe`` hooks.
"""

from .base import (
    AppendAck,
    ApplyFn,
    BufferFullError,
    RecordLog,
    StoreClosedError,
    StoreError,
    StoreLockedError,
)
from .embedded import EmbeddedConfig, EmbeddedLog
from .factory import Store, memory_store, open_store
from .memory import MemoryLog
from .records import (
    AddDocument,
    AppendOutput,
    DeleteCollection,
    DeleteDocument,
    Record,
    RecordError,
    RecordKind,
    decode_record,
    encode_record,
)
from .redis_backend import RedisConfig, RedisLog
from .state import CollectionInfo, DocumentInfo, StateListener, StoreState

__all__ = [
    "AddDocument",
    "AppendAck",
    "AppendOutput",
    "ApplyFn",
    "BufferFullError",
    "CollectionInfo",
    "DeleteCollection",
    "DeleteDocument",
    "DocumentInfo",
    "EmbeddedConfig",
    "EmbeddedLog",
    "MemoryLog",
    "Record",
    "RecordError",
    "RecordKind",
    "RecordLog",
    "RedisConfig",
    "RedisLog",
    "StateListener",
    "Store",
    "StoreClosedError",
    "StoreError",
    "StoreLockedError",
    "StoreState",
    "decode_record",
    "encode_record",
    "memory_store",
    "open_store",
]
