"""Advisory locks in the two-int form (namespace, key) and the registry of keys.

Every key paygate takes is derived here, so a test can prove no two users share one (two workers
sharing a key would put one of them into silent standby)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from paygate_cli.errors import LockHeld

if TYPE_CHECKING:
    import psycopg

# int4 of b"payg": the namespace keeps our keys apart from other applications' advisory locks.
LOCK_NAMESPACE = int.from_bytes(b"payg", "big")
MIGRATE_KEY = 0  # `paygate migrate`; worker keys start at 100
SLOT_STRIDE = 100  # worker N's slots are N*100 .. N*100+99


def worker_lock_key(worker_id: int, slot: int) -> int:
    if not 1 <= worker_id <= 20_000_000 or not 0 <= slot < SLOT_STRIDE:
        raise ValueError(f"lock key out of range: worker_id={worker_id} slot={slot}")
    return worker_id * SLOT_STRIDE + slot


def describe_key(key: int) -> tuple[int, int]:
    """(worker_id, slot) for a key seen in pg_locks."""
    return divmod(key, SLOT_STRIDE)


TRY_LOCK_SQL = "SELECT pg_try_advisory_lock(%s, %s)"
LOCK_SQL = "SELECT pg_advisory_lock(%s, %s)"
UNLOCK_SQL = "SELECT pg_advisory_unlock(%s, %s)"


def try_lock(conn: psycopg.Connection, key: int) -> bool:
    row = conn.execute(TRY_LOCK_SQL, (LOCK_NAMESPACE, key)).fetchone()
    return bool(row and row[0])


def wait_lock(conn: psycopg.Connection, key: int, wait_seconds: float) -> bool:
    """Block up to wait_seconds for the lock (server-side lock_timeout, so no busy loop)."""
    import psycopg

    if wait_seconds <= 0:
        return try_lock(conn, key)
    # Postgres holds lock_timeout in an int of milliseconds: a longer --lock-wait waits "as long as it can".
    conn.execute(f"SET lock_timeout = {min(2**31 - 1, max(1, int(wait_seconds * 1000)))}")
    try:
        conn.execute(LOCK_SQL, (LOCK_NAMESPACE, key))
        return True
    except psycopg.errors.LockNotAvailable:
        return False
    finally:
        conn.execute("RESET lock_timeout")


def acquire_slot(conn: psycopg.Connection, keys: list[int], wait_seconds: float, *, what: str,
                 poll_interval: float = 0.1) -> int:
    """Take the first free key of `keys`; wait up to wait_seconds. Returns the key, or raises LockHeld."""
    if len(keys) == 1:
        if wait_lock(conn, keys[0], wait_seconds):
            return keys[0]
        raise LockHeld(f"{what}: lock held by another process (waited {wait_seconds:g}s); skipped")
    deadline = time.monotonic() + wait_seconds
    while True:
        for key in keys:
            if try_lock(conn, key):
                return key
        if time.monotonic() >= deadline:
            raise LockHeld(f"{what}: all {len(keys)} slots are held by other processes; skipped")
        time.sleep(poll_interval)
