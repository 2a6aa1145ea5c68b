"""Caches of the service: degrees, calibrations, replays and noise-free prefixes.

In process by default; with ``PPR_REDIS_URL`` shared through Redis with an in-process
fallback that keeps serving (``degraded``) while Redis is down.
"""

from service.cache.byte_stores import (
    ByteStore,
    EventHook,
    MemoryStore,
    RedisStore,
    ResilientStore,
    store_state,
)
from service.cache.caches import (
    Caches,
    CalibrationCache,
    CalibrationKey,
    CorruptValue,
    DegreeCache,
    PrefixCache,
    RecentReleases,
    ReplayCache,
    build_caches,
    decode_array,
    encode_array,
)

__all__ = [
    "ByteStore",
    "Caches",
    "CalibrationCache",
    "CalibrationKey",
    "CorruptValue",
    "DegreeCache",
    "EventHook",
    "MemoryStore",
    "PrefixCache",
    "RecentReleases",
    "RedisStore",
    "ReplayCache",
    "ResilientStore",
    "build_caches",
    "decode_array",
    "encode_array",
    "store_state",
]
