"""The billing contract's instance archived under live traffic (docs/architecture.md §4 "State
archival (TTL)", §6 "TTL keeper"), on a devnet whose persistent entries live 1,000 ledgers: every
money path (a deposit, charges, a relay) and the TTL keeper work over it in the same ledgers.

Each path's simulation restores what its call touches on the way (ext v1), the keeper's own restore
of the contract's entries races them, and whichever lands first, nothing is ever sent that fails with
ENTRY_ARCHIVED, nothing is failed or expired for it, no attempt is counted, no restore asks a human;
every unit settles and what the keeper keeps alive is live on chain and in ttl_entries.

The case where a path cannot restore on the way (its restore does not fit: a restorePreamble) and
waits for the keeper's restore is tests/journal/test_archived_entries.py's; months of ledgers with the
keeper ticking are tests/workers/test_ttl_keeper.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import ChainEnv, billing_balance, chain_environ
from tests.support.charges_support import admit_charge, fund
from tests.support.devnet_support import MAX_SHORT_TTL, SHORT_TTL, DevnetHandle, start_short_ttl_devnet
from tests.support.funding import admit
from tests.support.relay_support import admit_relay, allow_market

MIN_P = SHORT_TTL  # ledgers a new (or restored) persistent entry lives
MAX_TTL = MAX_SHORT_TTL  # nothing lives longer
DEPOSIT = 20_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_short_ttl_devnet(tmp_path / "devnet")
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    # threshold 10 ledgers: a restored entry (1,000 ledgers) is never due, only restores are in play
    environ.update(PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_SETTLEMENT_LEASE="1s", PAYGATE_FEE_STATS_CACHE="0s",
                   PAYGATE_TTL_THRESHOLD="50s")
    return ChainEnv(devnet, dsn, environ)


def live_until(devnet: DevnetHandle, key_xdr: str) -> int:
    [found] = devnet.rpc("getLedgerEntries", {"keys": [key_xdr]})["entries"]
    return int(found["liveUntilLedgerSeq"])


def test_every_path_over_an_archived_billing_instance_settles_and_nothing_fails(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    devnet, users = chain.devnet, chain.genesis["users"]
    allow_market(db, chain.genesis["contracts"]["market"])
    fund(chain, db, [(users[0], DEPOSIT)])
    assert chain.tick("ttl", "--once").code == 0  # registers the kept entries, all live
    kept = {r[0]: r[1] for r in db.execute("SELECT kind, key_xdr FROM paygate.ttl_entries")}
    assert set(kept) == {"instance", "code", "sac_balance", "account_balance"}
    devnet.rpc("devnet_advance", {"ledgers": MAX_TTL + 50})  # nobody kept anything alive: all archived
    assert all(live_until(devnet, k) == 0 for k in kept.values())  # getLedgerEntries: archived is 0

    db.execute("UPDATE paygate.ttl_entries SET read_at = now() - interval '2 hours'")  # read again now
    found = chain.tick("ttl", "--once")
    assert found.code == 0, found.err
    assert {s for (s,) in db.execute("SELECT state FROM paygate.ttl_entries")} == {"archived"}
    assert [k for (k,) in db.execute("SELECT kind FROM paygate.ttl_jobs")] == ["restore"]

    # The paths' units arrive while the keeper's restore is still pending.
    deposit = admit(chain, db, user=1, amount=DEPOSIT)
    charges = [admit_charge(db, users[0]["public"], 1_000, f"over-archive-{n}")[0] for n in range(3)]
    relay = admit_relay(db, devnet, users[2], "over-archive-relay")
    workers = ["ttl", "funding", "settlement", "relay", "observer", "ttl"]
    for _ in range(20):
        for worker in workers:
            result = chain.tick(worker, "--once")
            assert result.code in (0, 1), (worker, result.code, result.err[-2000:])
        devnet.close_ledger()
        open_rows = db.execute("""
            SELECT (SELECT count(*) FROM paygate.deposits WHERE status = 'pending')
                 + (SELECT count(*) FROM paygate.charges WHERE status = 'authorized')
                 + (SELECT count(*) FROM paygate.relays WHERE status = 'queued')
                 + (SELECT count(*) FROM paygate.ttl_jobs WHERE status = 'pending')
                 + (SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated', 'signed', 'sent'))
        """).fetchone()[0]
        if not open_rows:
            break
    else:
        raise AssertionError("the paths did not go quiet over the archived instance: " + repr([
            db.execute("SELECT id, status, reason FROM paygate.deposits").fetchall(),
            db.execute("SELECT id, status, reason, attempts FROM paygate.charges").fetchall(),
            db.execute("SELECT id, status FROM paygate.relays").fetchall(),
            db.execute("SELECT id, kind, status, reason, lineage_id, attempts FROM paygate.ttl_jobs").fetchall(),
            db.execute("SELECT id, purpose, state, result_code, resolution FROM paygate.lineages ORDER BY id"
                       ).fetchall()]))
    for worker in ("ttl", "ttl"):  # the keeper reads what the paths and its restore left
        db.execute("UPDATE paygate.ttl_entries SET read_at = now() - interval '2 hours'")
        assert chain.tick(worker, "--once").code == 0

    # Every unit settled, nothing failed, expired or counted as an attempt for the archive.
    assert db.execute("SELECT status, reason FROM paygate.deposits WHERE id = %s", (deposit,)).fetchone() == (
        "settled", None)
    assert db.execute("SELECT status, count(*), max(attempts) FROM paygate.charges WHERE id = ANY(%s) GROUP BY status",
                      (charges,)).fetchall() == [("settled", 3, 0)]
    assert db.execute("SELECT status FROM paygate.relays WHERE id = %s", (relay,)).fetchone()[0] == "applied"
    # No transaction of paygate's failed on chain (ENTRY_ARCHIVED or anything else), none expired.
    assert db.execute("SELECT purpose, state, result_code FROM paygate.lineages WHERE state IN ('failed', 'expired')"
                      ).fetchall() == []
    jobs = db.execute("SELECT kind, status, reason FROM paygate.ttl_jobs ORDER BY id").fetchall()
    assert all(status == "applied" for _, status, _ in jobs), jobs  # the restore landed or found nothing to do
    assert db.execute("SELECT kind, state FROM paygate.ttl_entries WHERE state <> 'live'").fetchall() == []
    latest = devnet.latest_ledger()
    for kind, key in kept.items():
        assert live_until(devnet, key) >= latest, kind
    assert billing_balance(chain, users[1]["public"]) == DEPOSIT
    assert billing_balance(chain, users[0]["public"]) == DEPOSIT - 3_000
