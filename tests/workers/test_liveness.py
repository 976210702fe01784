"""the money paths must not stall silently. Each test names one defect and fails on the code
before the fix: the observer winning the credit race leaked the credit lineage's lane (1), a bad lane
stalled its queue or stranded a deposit (2), a worker whose lease lapsed exited 70 (4), a stale
pending_failure sent a landed deposit to a human (5), an authorisation was used in its last ledger
(6), and no progress looked like success (8)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from stellar_sdk import FeeBumpTransactionEnvelope, Keypair

from paygate_cli.journal.keyring import Keyring
from tests.support.chain_env import ChainEnv, admit_deposit, billing_balance, sign_deposit
from tests.support.charges_support import admit_charge, charge_chain, fund
from tests.support.cli import spawn
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.funding import assert_invariants, lineages_of, row_of, wait_for_leases
from tests.support.lanes import remove_operator

AMOUNT = 25_000_000
LIVE = "SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated', 'signed', 'sent')"


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=4)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return charge_chain(devnet, dsn, tmp_path / "keys")


def admit(chain: ChainEnv, db: psycopg.Connection, user: int, amount: int = AMOUNT, **sign: Any) -> int:
    u = chain.genesis["users"][user]
    entry, nonce, expiration = sign_deposit(chain.devnet, u["secret"], amount, **sign)
    return admit_deposit(db, u["public"], amount, entry, nonce, expiration, f"dep-{user}-{nonce}")


def tick_json(chain: ChainEnv, worker: str) -> tuple[int, dict[str, Any], str]:
    result = chain.tick(worker, "--once")
    doc = json.loads(result.out) if result.out.strip() else {}
    return result.code, doc, result.err


def lanes_by_address(chain: ChainEnv) -> list[str]:
    return sorted(p["public"] for p in chain.genesis["lanes"])


# -- (1) every lineage reaches a terminal state, whoever settles its row -----------------------------

def test_the_observer_winning_the_credit_race_does_not_leak_the_lane(chain: ChainEnv, db: psycopg.Connection
                                                                      ) -> None:
    """Two lanes, two deposits whose credits the observer applies before funding looks again: the
    credit lineages must still be resolved (applied), or both lanes stay busy for ever and every
    later deposit waits while funding exits 0."""
    first = [admit(chain, db, user=u) for u in (0, 1)]
    assert chain.tick("funding", "--once").code == 0  # both deposits sent, one per lane
    chain.devnet.close_ledger()
    assert chain.tick("funding", "--once").code == 0  # deposits applied, both credits sent
    chain.devnet.close_ledger()
    assert chain.tick("observer", "--once").code == 0  # the observer wins: it settles both rows
    assert {row_of(db, i)["settled_by"] for i in first} == {"observer"}
    assert db.execute(LIVE).fetchone()[0] == 2  # the credit lineages are still `sent`
    later = [admit(chain, db, user=u) for u in (2, 3)]
    for _ in range(12):
        assert chain.tick("funding", "--once").code == 0
        assert chain.tick("observer", "--once").code == 0
        if all(row_of(db, i)["status"] == "settled" for i in later) and not db.execute(LIVE).fetchone()[0]:
            break
        chain.devnet.close_ledger()
    credits = [x for x in lineages_of(db) if x["purpose"] == "credit"]
    assert [x["state"] for x in credits] == ["applied"] * 4, credits
    assert_invariants(chain, db, first + later)


def test_funding_and_the_observer_running_together_leak_no_lane(chain: ChainEnv, db: psycopg.Connection) -> None:
    """Real processes: funding and the observer loop at once on two lanes while ledgers close and
    deposits keep arriving. Every deposit settles and no lineage is left live."""
    procs = [spawn("run-tick", worker, "--every", "0.3s", "--for", "40s", "--json", environ=chain.environ)
             for worker in ("funding", "observer")]
    ids: list[int] = []
    try:
        deadline = time.monotonic() + 38
        for n in range(8):
            ids.append(admit(chain, db, user=n % 4))
            for _ in range(3):
                time.sleep(0.35)
                chain.devnet.close_ledger()
        while time.monotonic() < deadline:
            if all(row_of(db, i)["status"] == "settled" for i in ids) and not db.execute(LIVE).fetchone()[0]:
                break
            time.sleep(0.35)
            chain.devnet.close_ledger()
    finally:
        for proc in procs:
            proc.terminate()
        outputs = [proc.communicate(timeout=30) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode in (0, 143), err[-3000:]
    statuses = [row_of(db, i)["status"] for i in ids]
    assert statuses == ["settled"] * len(ids), (statuses, [(x["id"], x["purpose"], x["state"])
                                                           for x in lineages_of(db)])
    assert db.execute(LIVE).fetchone()[0] == 0
    assert all(x["state"] in ("applied", "abandoned") for x in lineages_of(db))
    for address, cached in db.execute("SELECT address, cached_balance FROM paygate.accounts").fetchall():
        assert int(cached) == billing_balance(chain, address)


# -- (2) a bad lane is fenced and its work moves at once ---------------------------------------------

def test_a_lane_that_lost_its_operator_right_is_fenced_and_charges_move_to_another(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    users = chain.genesis["users"]
    fund(chain, db, [(users[0], AMOUNT)])
    bad = lanes_by_address(chain)[0]  # first in address order: every allocator's first choice before
    db.execute("UPDATE paygate.lanes SET last_allocated_at = NULL")
    remove_operator(chain, bad)
    ids = [admit_charge(db, users[0]["public"], 1000 + i, f"c{i}")[0] for i in range(3)]
    code, _, err = tick_json(chain, "settlement")
    assert code == 3, err  # alarmed: a human must look at the lane...
    assert "journal.lane_fenced" in err
    lane = db.execute("SELECT status, drained_by FROM paygate.lanes WHERE address = %s", (bad,)).fetchone()
    assert lane == ("drained", "paygate:lane_failure")
    audit = db.execute("SELECT details FROM paygate.audit_log WHERE action = 'lane.fence' AND target = %s",
                       (bad,)).fetchall()
    assert len(audit) == 1 and "operator" in audit[0][0]["why"]
    # ...and the charges went out on the good lane in the same tick
    claimed = db.execute("SELECT DISTINCT x.lane, x.state FROM paygate.charges c JOIN paygate.lineages x "
                         "ON x.id = c.lineage_id WHERE c.id = ANY(%s)", (ids,)).fetchall()
    assert claimed == [(lanes_by_address(chain)[1], "sent")], claimed
    for _ in range(6):
        chain.devnet.close_ledger()
        code, _, err = tick_json(chain, "settlement")
        assert code == 0, err  # alarmed once, not at every tick
        assert tick_json(chain, "observer")[0] == 0
    statuses = db.execute("SELECT status FROM paygate.charges WHERE id = ANY(%s)", (ids,)).fetchall()
    assert statuses == [("settled",)] * 3


def test_a_deposit_whose_credit_fails_on_a_bad_lane_is_credited_on_another(
        chain: ChainEnv, db: psycopg.Connection, devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    """The SAC transfer landed: the user's USDC is in the contract. A credit simulation failing
    because the lane is no longer an operator must not send the deposit to a human."""
    three = start_devnet(tmp_path / "devnet3", lanes=3, users=2, seed="three")
    try:
        chain = charge_chain(three, dsn, tmp_path / "keys3")
        lanes = lanes_by_address(chain)
        pending_id = admit(chain, db, user=0)
        assert chain.tick("funding", "--once").code == 0
        [deposit] = lineages_of(db)
        assert deposit["lane"] == lanes[0]
        chain.devnet.close_ledger()
        # Both lanes the credit could be tried on first lose their operator right.
        remove_operator(chain, lanes[0])
        remove_operator(chain, lanes[1])
        for _ in range(8):
            result = chain.tick("funding", "--once")
            assert result.code in (0, 3), result.err
            if row_of(db, pending_id)["status"] != "pending":
                break
            chain.devnet.close_ledger()
        row = row_of(db, pending_id)
        assert row["status"] == "settled", row
        credits = [x for x in lineages_of(db) if x["purpose"] == "credit"]
        assert credits[-1]["state"] == "applied" and credits[-1]["lane"] == lanes[2]
        fenced = db.execute("SELECT address FROM paygate.lanes WHERE status = 'drained'").fetchall()
        assert (lanes[2],) not in fenced and fenced
        assert_invariants(chain, db, [pending_id])
    finally:
        three.stop()


def test_allocation_takes_the_least_recently_used_lane(chain: ChainEnv, db: psycopg.Connection) -> None:
    users = chain.genesis["users"]
    fund(chain, db, [(users[0], AMOUNT)])
    used = [x["lane"] for x in lineages_of(db)]
    # deposit then credit: two different lanes, never the same first choice twice in a row
    assert len(used) == 2 and used[0] != used[1]


# -- (4) a lost lease is "someone else has it" --------------------------------------------------------

def test_a_worker_stalled_past_its_lease_in_the_nonce_read_steps_aside(chain: ChainEnv, db: psycopg.Connection
                                                                       ) -> None:
    """A claims the deposit and stalls in its nonce read past its 1 s lease; B takes the row over and
    sends the deposit. A wakes: before, it reached allocate, hit the one-live-lineage-per-entitlement
    index and exited 70. Now it sees its lease is gone, writes nothing and exits 0."""
    pending_id = admit(chain, db, user=0)
    chain.devnet.set_fault("slow", ms=4000, count=1, methods=["getLedgerEntries"])
    slow = spawn("run-tick", "funding", "--once", "--json", environ=chain.environ)
    try:
        deadline = time.monotonic() + 30
        while chain.devnet.state()["faults"]:  # taken: A renewed its lease and is inside the slow read
            assert time.monotonic() < deadline and slow.poll() is None, slow.communicate()
            time.sleep(0.02)
        wait_for_leases(db)
        assert chain.tick("funding", "--once").code == 0  # B
        out, err = slow.communicate(timeout=60)
    finally:
        if slow.poll() is None:
            slow.kill()
    assert slow.returncode == 0, err
    assert '"lease_lost": 1' in out
    [deposit] = lineages_of(db)
    assert deposit["state"] == "sent"
    chain.devnet.close_ledger()
    for _ in range(6):
        wait_for_leases(db)
        chain.tick("funding", "--once")
        if row_of(db, pending_id)["status"] == "settled":
            break
        chain.devnet.close_ledger()
    assert_invariants(chain, db, [pending_id])


# -- (5) pending_failure is cleared when the lineage lands ---------------------------------------------

def test_a_stale_send_refusal_is_forgotten_when_the_same_bytes_land(chain: ChainEnv, db: psycopg.Connection) -> None:
    """The deposit's send was answered with a terminal code (recorded as pending_failure), yet the
    same bytes land: the deposit must settle, not go to a human from the stale reason."""
    pending_id = admit(chain, db, user=0)
    assert chain.tick("funding", "--once").code == 0  # sent (and queued on the devnet)
    db.execute("UPDATE paygate.deposits SET pending_failure = 'deposit rejected by the network: txBAD_AUTH' "
               "WHERE id = %s", (pending_id,))
    for _ in range(6):
        chain.devnet.close_ledger()
        assert chain.tick("funding", "--once").code == 0
        if row_of(db, pending_id)["status"] != "pending":
            break
    row = row_of(db, pending_id)
    assert row["status"] == "settled", row
    assert row["pending_failure"] is None
    assert_invariants(chain, db, [pending_id])


# -- (6) an authorisation is dead once no future ledger can accept it ----------------------------------

def test_an_authorisation_in_its_last_ledger_is_expired_not_failed(chain: ChainEnv, db: psycopg.Connection) -> None:
    pending_id = admit(chain, db, user=0, valid_ledgers=1)
    chain.devnet.close_ledger()  # latest == expiration ledger: the next ledger cannot accept it
    assert chain.devnet.latest_ledger() == row_of(db, pending_id)["auth_expiration_ledger"]
    assert chain.tick("funding", "--once").code == 0
    row = row_of(db, pending_id)
    assert row["status"] == "expired" and "expired at ledger" in row["reason"], row
    assert lineages_of(db) == []  # nothing was built, no fee paid


def test_a_deposit_transaction_carries_the_authorisations_ledger_bound(chain: ChainEnv, db: psycopg.Connection
                                                                        ) -> None:
    pending_id = admit(chain, db, user=0, valid_ledgers=30)
    assert chain.tick("funding", "--once").code == 0
    [lineage] = lineages_of(db)
    expiration = row_of(db, pending_id)["auth_expiration_ledger"]
    assert lineage["max_ledger"] == expiration
    keys = {k: bytes.fromhex(v) for k, v in json.loads(Path(chain.environ["PAYGATE_JOURNAL_KEYS_FILE"]).read_text()
                                                          ).items()}
    plain = Keyring(keys, lineage["key_id"]).decrypt(
        bytes(lineage["envelope"]), key_id=lineage["key_id"], lineage_id=lineage["id"], source=lineage["lane"],
        seq=lineage["source_seq"]).decode()
    envelope = FeeBumpTransactionEnvelope.from_xdr(plain, chain.genesis["passphrase"])
    inner = envelope.transaction.inner_transaction_envelope
    bounds = inner.transaction.preconditions.ledger_bounds
    assert bounds is not None and bounds.max_ledger == expiration + 1  # exclusive: may apply up to `expiration`


# -- (8) no progress must not look like success ---------------------------------------------------------

def test_every_lane_fenced_makes_funding_stall_not_succeed(chain: ChainEnv, db: psycopg.Connection) -> None:
    admit(chain, db, user=0)
    assert chain.tick("funding", "--once").code == 0  # lanes known to the journal
    chain.devnet.close_ledger()
    for _ in range(4):  # let the first deposit finish
        chain.tick("funding", "--once")
        chain.devnet.close_ledger()
    db.execute("UPDATE paygate.lanes SET status = 'drained', drained_at = now(), drained_by = 'test'")
    admit(chain, db, user=1)
    code, _, err = tick_json(chain, "funding")
    assert code == 1, err
    assert "every lane is fenced or drained" in err
    assert db.execute("SELECT outcome, error FROM paygate.worker_runs WHERE worker = 'funding' ORDER BY id DESC "
                      "LIMIT 1").fetchone()[0] == "stalled"


def test_more_deposits_than_lanes_is_a_backlog_not_a_stall(chain: ChainEnv, db: psycopg.Connection) -> None:
    """Two lanes, four deposits: the tick sends two and the other two wait for a lane. Work moved, so
    the tick succeeds (no stall) — and the waiting ones go out as the lanes free up."""
    ids = [admit(chain, db, user=n) for n in range(4)]
    code, doc, err = tick_json(chain, "funding")
    assert code == 0, err
    assert doc["run_tick"]["last_details"] == {"deposit_sent": 2, "no_free_lane": 2}
    for _ in range(12):
        chain.devnet.close_ledger()
        code, _, err = tick_json(chain, "funding")
        assert code == 0, err
        if db.execute("SELECT count(*) FROM paygate.deposits WHERE status = 'pending'").fetchone()[0] == 0:
            break
    assert [row_of(db, i)["status"] for i in ids] == ["settled"] * 4


def test_a_leaked_lane_makes_settlement_stall_but_momentary_busy_does_not(chain: ChainEnv, db: psycopg.Connection
                                                                          ) -> None:
    users = chain.genesis["users"]
    fund(chain, db, [(users[0], AMOUNT)])
    # Both lanes busy with young lineages: "all lanes busy" for a moment is no stall.
    for n, lane in enumerate(lanes_by_address(chain)):
        db.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane) VALUES ('relay', %s, %s)",
                   (f"test:{n}", lane))
    admit_charge(db, users[0]["public"], 1000, "c0")
    code, _, err = tick_json(chain, "settlement")
    assert code == 0, err
    # The same lineages, far older than a lineage can live: a leak, reported.
    db.execute("ALTER TABLE paygate.lineages DISABLE TRIGGER lineage_transition_guard")
    db.execute("UPDATE paygate.lineages SET created_at = now() - interval '1 hour' WHERE purpose = 'relay'")
    db.execute("ALTER TABLE paygate.lineages ENABLE TRIGGER lineage_transition_guard")
    code, _, err = tick_json(chain, "settlement")
    assert code == 1, err
    assert "lane leak" in err


# -- a drained instance finishes what it holds and takes nothing new -----------------------------------

def drained_tick(chain: ChainEnv, worker: str) -> Any:
    """One tick of `worker` with TickContext.draining set, as the runner passes it for a drained
    instance: the worker's own behaviour, called directly (a real connection, settings, devnet)."""
    import logging

    from paygate_cli.context import TickContext
    from paygate_cli.db.connect import connect
    from paygate_cli.settings import load_settings
    from paygate_cli.workers import funding, settlement

    settings = load_settings(chain.environ)
    module = {"funding": funding, "settlement": settlement}[worker]
    with connect(settings, f"test-{worker}") as conn:
        ctx = TickContext(conn=conn, settings=settings, worker=worker, instance_id="drained-host", slot=0,
                          batch=16, log=logging.getLogger(worker), draining=True)
        return module.tick(ctx)


def test_a_drained_instance_drives_in_flight_work_but_claims_nothing_new(chain: ChainEnv, db: psycopg.Connection
                                                                        ) -> None:
    users = chain.genesis["users"]
    fund(chain, db, [(users[0], AMOUNT)])
    in_flight = admit(chain, db, user=1)
    admit_charge(db, users[0]["public"], 1000, "before")
    assert chain.tick("funding", "--once").code == 0  # the deposit is sent
    assert chain.tick("settlement", "--once").code == 0  # the charge batch is sent
    fresh = admit(chain, db, user=2)
    admit_charge(db, users[0]["public"], 2000, "after")
    for _ in range(6):
        chain.devnet.close_ledger()
        time.sleep(1.05)  # leases (1 s) of the first ticks lapse: the drained instance may drive them
        drained_tick(chain, "funding")
        drained_tick(chain, "settlement")
        assert chain.tick("observer", "--once").code == 0
    assert row_of(db, in_flight)["status"] == "settled"  # what was in flight was finished
    assert row_of(db, fresh)["status"] == "pending" and row_of(db, fresh)["deposit_lineage_id"] is None
    charges = dict(db.execute("SELECT amount::int, status FROM paygate.charges").fetchall())
    assert charges == {1000: "settled", 2000: "authorized"}


def test_a_lane_whose_account_is_not_on_chain_never_stalls_the_deposit(chain: ChainEnv,
                                                                        db: psycopg.Connection) -> None:
    """A lane key in the secrets file whose account is not on chain (never created, or merged away).
    Before, the worker exited 78 at every tick it picked that lane. With one read endpoint (this
    test's development override) absence cannot be proven (a lone node cannot tell that it lags):
    the tick that picked it hands its work back as "not visible yet" (69), and least-recently-used
    allocation sends the deposit out on a genuine lane at the next tick. (With a quorum of caught-up
    read hosts the lane is proven missing and fenced at once: tests/chain/test_node_lag.py.)"""
    genuine = lanes_by_address(chain)
    ghost = Keypair.random()
    while ghost.public_key > genuine[0]:  # first in address order too: what the old allocator picked
        ghost = Keypair.random()
    lanes_file = Path(chain.environ["PAYGATE_LANE_SECRETS_FILE"])
    lanes_file.write_text(lanes_file.read_text() + ghost.secret + "\n")
    pending_id = admit(chain, db, user=0)
    code, _, err = tick_json(chain, "funding")
    assert code == 69 and "not visible on chain yet" in err and ghost.secret not in err, err
    assert db.execute("SELECT status FROM paygate.lanes WHERE address = %s", (ghost.public_key,)).fetchone() == (
        "active",)  # unproven: not fenced
    for _ in range(6):
        code, _, err = tick_json(chain, "funding")
        assert code == 0, err
        if row_of(db, pending_id)["status"] == "settled":
            break
        chain.devnet.close_ledger()
    assert row_of(db, pending_id)["status"] == "settled"
    deposit = [x for x in lineages_of(db) if x["state"] == "applied"]
    assert deposit and all(x["lane"] in genuine for x in deposit)
    assert_invariants(chain, db, [pending_id])
