"""cuts keep their promises: the XDR built directly is the SDK's exact bytes, and a phase
written as one statement is all or nothing (paygate.require rolls every part back)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stellar_sdk import Account, Keypair, Network, SorobanDataBuilder, TransactionBuilder, scval
from stellar_sdk.base_soroban_server import _assemble_transaction
from stellar_sdk.soroban_rpc import SimulateTransactionResponse

from paygate_cli.chain.contracts import Invocation, build_signed
from paygate_cli.journal import lineage as lineages

PASSPHRASE = Network.STANDALONE_NETWORK_PASSPHRASE
CONTRACT = "CDYAT2YCKJDYQTVDXSFYW3CV3AXDMQIFAK3QVU6L6SKKPVRFDBDG6OAX"


@dataclass
class CannedChain:
    """What build_signed needs of a ChainClient: the passphrase and one simulation answer."""

    passphrase: str
    answer: SimulateTransactionResponse
    simulated: list[str]

    def simulate(self, envelope_xdr: Any) -> SimulateTransactionResponse:
        self.simulated.append(envelope_xdr)
        return self.answer


def source_auth_entry(public_key: str) -> str:
    """A simulation's recorded auth entry (what assemble copies in when the call carries none)."""
    from stellar_sdk import xdr

    return xdr.SorobanAuthorizationEntry(
        credentials=xdr.SorobanCredentials(xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT),
        root_invocation=xdr.SorobanAuthorizedInvocation(
            function=xdr.SorobanAuthorizedFunction(
                xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
                contract_fn=xdr.InvokeContractArgs(
                    contract_address=scval.to_address(CONTRACT).address, function_name=xdr.SCSymbol(b"credit"),
                    args=[scval.to_address(public_key)])),
            sub_invocations=[])).to_xdr()


@settings(max_examples=25, deadline=None)
@given(seq=st.integers(2, 2**40), resource_fee=st.integers(0, 10**7), base_fee=st.integers(100, 150),
       bump_fee=st.integers(150, 10_000), max_time=st.integers(1, 2**32 - 1),
       max_ledger=st.none() | st.integers(1, 2**31), amount=st.integers(0, 2**100), with_auth=st.booleans(),
       carries_auth=st.booleans(), recorded=st.integers(1, 3))
def test_build_signed_is_byte_identical_to_the_sdk(seq: int, resource_fee: int, base_fee: int, bump_fee: int,
                                                    max_time: int, max_ledger: int | None, amount: int,
                                                    with_auth: bool, carries_auth: bool, recorded: int) -> None:
    """`with_auth`: the simulation recorded `recorded` auth entries (assembly copies them in only when
    the call carries none); `carries_auth`: the call brings its own entry (a user's signed one)."""
    from stellar_sdk import xdr

    lane, fee = Keypair.random(), Keypair.random()
    own = [xdr.SorobanAuthorizationEntry.from_xdr(source_auth_entry(fee.public_key))] if carries_auth else []
    call = Invocation(CONTRACT, "credit", [scval.to_address(lane.public_key), scval.to_int128(amount)], own)
    data = SorobanDataBuilder().set_resource_fee(resource_fee).set_resources(10, 20, 30).build().to_xdr()
    answer = SimulateTransactionResponse.model_validate({
        "transactionData": data, "minResourceFee": resource_fee, "latestLedger": 7,
        "results": [{"auth": [source_auth_entry(lane.public_key)] * recorded if with_auth else [],
                     "xdr": "AAAAAQ=="}]})
    chain = CannedChain(PASSPHRASE, answer, [])

    ours = build_signed(chain, lane=lane, fee_account=fee, seq=seq, call=call, max_time=max_time,  # type: ignore[arg-type]
                        base_fee=base_fee, bid_rate=bump_fee, max_ledger=max_ledger)

    builder = TransactionBuilder(Account(lane.public_key, seq - 1), PASSPHRASE, base_fee=base_fee)
    builder.append_invoke_contract_function_op(CONTRACT, "credit", call.args, auth=list(own))
    builder.add_time_bounds(0, max_time)
    if max_ledger is not None:
        builder.set_ledger_bounds(0, max_ledger + 1)
    unsigned = builder.build()
    assert chain.simulated == [unsigned.to_xdr()]  # the simulation saw the SDK's own bytes too
    prepared = _assemble_transaction(unsigned, answer)
    prepared.sign(lane)
    bump = TransactionBuilder.build_fee_bump_transaction(fee.public_key, bump_fee, prepared, PASSPHRASE)
    bump.sign(fee)
    assert ours.envelope_xdr == bump.to_xdr()
    assert (ours.inner_hash, ours.outer_hash) == (prepared.hash(), bump.hash())
    assert ours.fee == bump.transaction.fee and (ours.max_time, ours.max_ledger) == (max_time, max_ledger)


# -- one statement, all or nothing ----------------------------------------------------------------

def _allocated(db: psycopg.Connection, lane: str) -> int:
    db.execute("INSERT INTO paygate.lanes (address) VALUES (%s) ON CONFLICT DO NOTHING", (lane,))
    return int(db.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane) VALUES ('deposit', 'e:1', %s) "
                          "RETURNING id", (lane,)).fetchone()[0])


def _anchor(db: psycopg.Connection, lineage_id: int, *, hold: str, install: str) -> tuple[Any, ...]:
    sql = lineages.ANCHOR_HELD_SQL.format(hold=hold, install=install)
    return lineages.one_statement(db, sql, {
        "x_id": lineage_id, "x_seq": 5, "x_key_id": "k1", "x_envelope": b"sealed", "x_inner_hash": b"\1" * 32,
        "x_outer_hash": b"\2" * 32, "x_max_time": 100, "x_signed_at_ledger": 3, "x_max_ledger": None,
        "x_bid_rate": 200, "x_fee_ops": 2, "x_resource_fee": 0, "x_cap_rate": 100_000}).fetchone()


def test_a_row_part_that_does_not_follow_rolls_the_whole_anchor_back(db: psycopg.Connection) -> None:
    lineage_id = _allocated(db, Keypair.random().public_key)
    # The row's own part matches nothing (as a relay whose pointer moved would): the statement fails
    # with require()'s SQLSTATE and the lineage is still allocated, nothing of the envelope written.
    with pytest.raises(psycopg.Error) as failed:
        _anchor(db, lineage_id, hold="SELECT 1", install="SELECT 1 FROM anchored WHERE false")
    assert failed.value.sqlstate == lineages.REQUIRE_FAILED
    assert db.execute("SELECT state, envelope FROM paygate.lineages WHERE id = %s",
                      (lineage_id,)).fetchone() == ("allocated", None)
    # A lost lease (the hold finds no row) writes nothing either, and says so without an error.
    assert _anchor(db, lineage_id, hold="SELECT 1 WHERE false", install=lineages.NO_INSTALL)[:2] == (0, 0)
    assert db.execute("SELECT state FROM paygate.lineages WHERE id = %s", (lineage_id,)).fetchone() == ("allocated",)
    # Held and followed: anchored, durably (the default synchronous commit).
    assert _anchor(db, lineage_id, hold="SELECT 1", install=lineages.NO_INSTALL)[:2] == (1, 1)
    assert db.execute("SELECT state, source_seq FROM paygate.lineages WHERE id = %s",
                      (lineage_id,)).fetchone() == ("signed", 5)


def test_one_statement_inside_a_callers_transaction_keeps_it_usable(db: psycopg.Connection) -> None:
    lineage_id = _allocated(db, Keypair.random().public_key)
    with db.transaction():
        with pytest.raises(psycopg.Error):
            _anchor(db, lineage_id, hold="SELECT 1", install="SELECT 1 FROM anchored WHERE false")
        # The failure rolled back its savepoint only: the caller's transaction goes on.
        assert db.execute("SELECT state FROM paygate.lineages WHERE id = %s", (lineage_id,)).fetchone() == (
            "allocated",)
