"""Crash drills for the funding path (the drill invariants (docs/architecture.md §1)).

Each drill kills a real `paygate run-tick funding --once` process with SIGKILL at one named crash
point, then runs ticks (in-process) with ledgers closing until nothing is left to do, and checks the
money invariants against the chain: one credit per deposit, one SAC transfer per authorisation,
cached balance = on-chain billing balance, no live lineage, no busy lane, at most one applied lineage
per entitlement. Devnet faults make some of them nastier.

Credential versions: the whole matrix signs the deposits as a current wallet does
(ADDRESS_V2); every crash point runs once more, without faults, with legacy ADDRESS (v1) entries,
as stellar-rpc records them without `useUpgradedAuth` and older SDKs sign them. Each drill checks
the deposit that landed carries the version the wallet signed (paygate never re-shapes an entry)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from stellar_sdk import FeeBumpTransactionEnvelope, xdr

from paygate_cli.journal.keyring import Keyring
from tests.support.chain_env import ChainEnv, chain_environ, credentials_type
from tests.support.cli import run_proc
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.drill_support import assert_crashed_at
from tests.support.funding import (
    admit,
    assert_invariants,
    crash_tick,
    is_quiet,
    lineages_of,
    row_of,
    run_until_quiet,
    wait_for_leases,
)

LEASE_S = 1.0  # PAYGATE_FUNDING_LEASE in chain_environ

CRASH_POINTS = [
    "funding.after_claim",
    "funding.after_allocate",
    "funding.after_sign",
    "funding.after_anchor",
    "funding.after_broadcast",
    "funding.after_deposit_applied",
    "funding.credit.after_allocate",
    "funding.credit.after_sign",
    "funding.credit.after_anchor",
    "funding.credit.after_broadcast",
    "funding.before_settle",
]
# In-process ticks (each followed by a ledger close) needed before the crash point is on the path
# of the next tick: the deposit must have been sent (1) or the credit too (2).
TICKS_BEFORE = {"funding.after_deposit_applied": 1, "funding.credit.after_allocate": 1,
                "funding.credit.after_sign": 1, "funding.credit.after_anchor": 1, "funding.credit.after_broadcast": 1,
                "funding.before_settle": 2}


# -- fixtures and helpers (the shared ones are tests/support/funding.py) ----------------------------

@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


def crash_environ(chain: ChainEnv, point: str) -> dict[str, str]:
    return {**chain.environ, "PAYGATE_ENABLE_CRASHPOINTS": "1", "PAYGATE_CRASH_AT": point}


def prepare_to(chain: ChainEnv, db: psycopg.Connection, point: str) -> None:
    """Bring the deposit to the phase just before `point` with normal in-process ticks."""
    for _ in range(TICKS_BEFORE.get(point, 0)):
        result = chain.tick("funding", "--once")
        assert result.code == 0, result.err
        chain.devnet.close_ledger()


# -- one drill per crash point ------------------------------------------------------------------------

FAULTS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "plain": None,
    # the recovery resend (or the crashed send) is queued but its answer never arrives
    "answer_lost": ("lose_send_answer", {"count": 2}),
    # sequence reads see the lane as of 3 ledgers ago (allocation and probes)
    "sequence_lag": ("account_lag", {"ledgers": 3}),
    # the next transaction accepted stays queued 3 ledgers before it lands
    "late_landing": ("hold_next", {"ledgers": 3}),
    # the next transaction accepted is never included (dropped after 4 ledgers, banned): only its
    # maxTime passing proves it dead, then a fresh lineage lands
    "dropped": ("drop_next", {}),
    # the node refuses to queue the next sends
    "try_again_later": ("try_again_later", {"count": 3}),
}

FAULT_DRILLS = [pytest.param(point, "plain", id=point.split(".", 1)[1]) for point in CRASH_POINTS] + [
    pytest.param("funding.after_anchor", "answer_lost", id="after_anchor+answer_lost"),
    pytest.param("funding.after_broadcast", "answer_lost", id="after_broadcast+answer_lost"),
    pytest.param("funding.credit.after_broadcast", "late_landing", id="credit.after_broadcast+late_landing"),
    pytest.param("funding.after_broadcast", "late_landing", id="after_broadcast+late_landing"),
    pytest.param("funding.after_deposit_applied", "sequence_lag", id="after_deposit_applied+sequence_lag"),
    pytest.param("funding.after_sign", "sequence_lag", id="after_sign+sequence_lag"),
    pytest.param("funding.after_broadcast", "dropped", id="after_broadcast+dropped"),
    pytest.param("funding.credit.after_broadcast", "dropped", id="credit.after_broadcast+dropped"),
    pytest.param("funding.after_anchor", "try_again_later", id="after_anchor+try_again_later"),
    pytest.param("funding.credit.after_anchor", "answer_lost", id="credit.after_anchor+answer_lost"),
    pytest.param("funding.credit.after_sign", "sequence_lag", id="credit.after_sign+sequence_lag"),
    pytest.param("funding.credit.after_anchor", "try_again_later", id="credit.after_anchor+try_again_later"),
]
# (point, fault, upgraded): the matrix above with ADDRESS_V2, every crash point once more with v1.
DRILLS = [pytest.param(*p.values, True, id=p.id) for p in FAULT_DRILLS] + [
    pytest.param(point, "plain", False, id=point.split(".", 1)[1] + "@v1") for point in CRASH_POINTS]


@pytest.mark.parametrize(("point", "fault", "upgraded"), DRILLS)
def test_crash_drill(chain: ChainEnv, db: psycopg.Connection, point: str, fault: str, upgraded: bool) -> None:
    if fault == "sequence_lag":
        chain.devnet.close_ledger(4)  # history for the lagging reads (the devnet keeps per-ledger versions)
    first = admit(chain, db, user=0, upgraded=upgraded)
    second = admit(chain, db, user=1, upgraded=upgraded)
    ctype = credentials_type(upgraded)
    assert {xdr.SorobanAuthorizationEntry.from_xdr(row_of(db, r)["auth_entry"]).credentials.type
            for r in (first, second)} == {ctype}
    prepare_to(chain, db, point)
    spec = FAULTS[fault]
    if spec is not None:
        chain.devnet.set_fault(spec[0], **spec[1])
    crash_tick(chain, point)
    # the process died mid-flight: the rows are still pending (nothing was settled by the dead process)
    assert row_of(db, first)["status"] == "pending"
    run_until_quiet(chain, db)
    chain.devnet.clear_faults()
    assert_invariants(chain, db, [first, second], credentials=ctype)
    if fault == "sequence_lag":  # stale sequence reads never made us sign a number already consumed
        assert all(x["state"] in ("applied", "abandoned") for x in lineages_of(db)), lineages_of(db)
    if fault == "dropped":  # the dropped attempt was proven dead by time, never by a guess
        dead = [x for x in lineages_of(db) if x["state"] == "expired"]
        assert len(dead) == 1 and "maxTime" in dead[0]["resolution"], lineages_of(db)


# -- the two classic branches -----------------------------------------------------------------------

def test_killed_after_send_returned_recovery_records_the_receipt(chain: ChainEnv, db: psycopg.Connection) -> None:
    """(A) The send went out and was accepted; the process died before reading the answer. The next
    tick (lease lapsed) finds the receipt on chain and records it: no second deposit is ever signed."""
    pending_id = admit(chain, db)
    crash_tick(chain, "funding.after_broadcast")
    [deposit] = lineages_of(db)
    assert deposit["state"] == "signed" and deposit["send_count"] == 0  # the answer was never recorded
    queued = [q["innerHash"] for q in chain.devnet.state()["queue"]]
    assert queued == [bytes(deposit["inner_hash"]).hex()]  # ...but the bytes reached the network
    chain.devnet.close_ledger()
    wait_for_leases(db)
    result = chain.tick("funding", "--once")
    assert result.code == 0, result.err
    deposits = [x for x in lineages_of(db) if x["purpose"] == "deposit"]
    assert [(x["id"], x["state"]) for x in deposits] == [(deposit["id"], "applied")]
    assert deposits[0]["ledger"] is not None and deposits[0]["resolution"].startswith("receipt SUCCESS")
    assert bytes(row_of(db, pending_id)["deposit_tx"]) == bytes(deposit["inner_hash"])
    run_until_quiet(chain, db)
    assert len([x for x in lineages_of(db) if x["purpose"] == "deposit"]) == 1
    assert_invariants(chain, db, [pending_id])


def test_killed_before_broadcast_then_sequence_consumed_is_superseded(chain: ChainEnv, db: psycopg.Connection
                                                                      ) -> None:
    """(B) Signed and anchored, killed before the broadcast; then a transaction we never journaled
    takes the lane's sequence. docs/architecture.md §4 step 3: the lineage is proven `superseded` (it can never
    land), and because no lineage of ours holds that sequence a human is asked (exit 3) and the lane
    is fenced. The deposit itself is not in doubt (its nonce is unspent and its only lineage is
    proven dead), so a fresh lineage on another lane lands it: one spend."""
    pending_id = admit(chain, db)
    crash_tick(chain, "funding.after_anchor")
    [first] = lineages_of(db)
    assert first["state"] == "signed" and chain.devnet.state()["queue"] == []
    chain.devnet.rpc("devnet_consumeSequence", {"account": first["lane"]})
    chain.devnet.close_ledger()
    wait_for_leases(db)
    result = chain.tick("funding", "--once")
    assert result.code == 3, (result.code, result.err)
    assert "never journaled" in result.err
    first = next(x for x in lineages_of(db) if x["id"] == first["id"])
    assert first["state"] == "superseded"
    assert "never journaled" in first["resolution"]
    lane = db.execute("SELECT status, drained_by FROM paygate.lanes WHERE address = %s", (first["lane"],)).fetchone()
    assert lane[0] == "drained" and "foreign" in lane[1]
    assert row_of(db, pending_id)["status"] == "pending"  # the deposit goes on
    run_until_quiet(chain, db)
    deposits = [x for x in lineages_of(db) if x["purpose"] == "deposit"]
    assert [x["state"] for x in deposits] == ["superseded", "applied"]
    assert deposits[1]["lane"] != first["lane"]  # never again on the fenced lane
    assert all(x["lane"] != first["lane"] for x in lineages_of(db)[1:])
    assert_invariants(chain, db, [pending_id])


# -- journal first: what is committed before the broadcast ------------------------------------------

def test_the_anchored_journal_row_describes_the_exact_bytes_sent(chain: ChainEnv, db: psycopg.Connection) -> None:
    """Rule 3: the envelope (encrypted), its hashes, source, sequence and maxTime are committed before
    the broadcast, and they are the truth about the bytes: decrypting the row gives a fee bump by the
    fee account around the lane's transaction at that sequence, with maxTime = the ledger close time
    at signing + the configured validity."""
    admit(chain, db)
    close_time = int(chain.devnet.state()["closeTime"])
    crash_tick_env = {**crash_environ(chain, "funding.after_anchor"), "PAYGATE_TX_VALIDITY": "45s"}
    result = run_proc("run-tick", "funding", "--once", environ=crash_tick_env, timeout=60)
    assert_crashed_at(result, "funding.after_anchor")
    [lineage] = lineages_of(db)
    assert lineage["state"] == "signed" and chain.devnet.state()["queue"] == []  # anchored, not yet sent
    keys = {k: bytes.fromhex(v) for k, v in json.loads(Path(chain.environ["PAYGATE_JOURNAL_KEYS_FILE"]).read_text()
                                                          ).items()}
    plain = Keyring(keys, lineage["key_id"]).decrypt(
        bytes(lineage["envelope"]), key_id=lineage["key_id"], lineage_id=lineage["id"], source=lineage["lane"],
        seq=lineage["source_seq"]).decode()
    envelope = FeeBumpTransactionEnvelope.from_xdr(plain, chain.genesis["passphrase"])
    inner = envelope.transaction.inner_transaction_envelope
    assert envelope.transaction.fee_source.account_id == chain.genesis["fee_account"]["public"]
    assert inner.transaction.source.account_id == lineage["lane"]
    assert inner.transaction.sequence == lineage["source_seq"]
    assert inner.transaction.preconditions.time_bounds.max_time == lineage["max_time"] == close_time + 45
    assert inner.hash() == bytes(lineage["inner_hash"]) and envelope.hash() == bytes(lineage["outer_hash"])
    assert lineage["signed_at_ledger"] == chain.devnet.latest_ledger()


def test_a_crash_at_every_phase_in_turn_still_spends_once(chain: ChainEnv, db: psycopg.Connection) -> None:
    """One deposit, seven real processes in a row, each killed at the next phase boundary (ledgers
    closing where the chain has to move): the journal carries the story across every death."""
    pending_id = admit(chain, db)
    for point, then in [("funding.after_claim", None), ("funding.after_allocate", None),
                        ("funding.after_sign", None), ("funding.after_anchor", "resend"),
                        ("funding.after_deposit_applied", None), ("funding.credit.after_broadcast", "close"),
                        ("funding.before_settle", None)]:
        wait_for_leases(db)
        crash_tick(chain, point)
        assert row_of(db, pending_id)["status"] == "pending", point
        if then == "resend":  # the anchored bytes were never sent: a normal tick sends them (same bytes)
            wait_for_leases(db)
            assert chain.tick("funding", "--once").code == 0
        if then:
            chain.devnet.close_ledger()
    # before the last recovery: the deposit went through on its third lineage, the credit landed
    assert [(x["purpose"], x["state"]) for x in lineages_of(db)] == [
        ("deposit", "abandoned"), ("deposit", "abandoned"), ("deposit", "applied"), ("credit", "applied")]
    run_until_quiet(chain, db)
    assert row_of(db, pending_id)["attempts"] == 9
    assert_invariants(chain, db, [pending_id])


@pytest.mark.parametrize("point", ["funding.credit.after_anchor", "funding.after_broadcast"])
def test_a_crashed_deposit_resumes_in_fresh_processes(chain: ChainEnv, db: psycopg.Connection, point: str) -> None:
    """The resume runs as new OS processes (no state shared with the test's interpreter)."""
    pending_id = admit(chain, db)
    prepare_to(chain, db, point)
    crash_tick(chain, point)
    assert row_of(db, pending_id)["status"] == "pending"
    for _ in range(12):
        wait_for_leases(db)
        result = run_proc("run-tick", "funding", "--once", "--json", environ=chain.environ, timeout=60)
        assert result.code == 0, result.err
        if is_quiet(db):
            break
        chain.devnet.close_ledger()
    assert_invariants(chain, db, [pending_id])
