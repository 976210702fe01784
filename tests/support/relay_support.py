"""Relay-path wiring for tests and the bench: a user's wallet signing market.buy, admission through
the SQL functions, the allow-list, and the chain facts the invariants are checked against (read
through SorobanServer only, never through paygate)."""

from __future__ import annotations

import psycopg
from stellar_sdk import Keypair, scval, xdr
from stellar_sdk.auth import authorize_invocation
from stellar_sdk.soroban_rpc import GetTransactionStatus

from tests.support.chain_env import ChainEnv, credentials_type
from tests.support.devnet_support import DevnetHandle

MAX_FEE = 5_000_000  # stroops reserved per relay in tests


def allow_market(db: psycopg.Connection, market: str) -> None:
    """market.buy relayed (a user's signature), market.close_expired as a bot job (permissionless):
    each on its own allow-list."""
    db.execute("INSERT INTO paygate.relay_allowlist (contract, function) VALUES (%s, 'buy') ON CONFLICT DO NOTHING",
               (market,))
    db.execute("INSERT INTO paygate.bot_job_allowlist (contract, function) VALUES (%s, 'close_expired') "
               "ON CONFLICT DO NOTHING", (market,))


def buy_args(user: str, item: str, price: int) -> list[xdr.SCVal]:
    return [scval.to_address(user), scval.to_symbol(item), scval.to_int128(price)]


def sign_buy(devnet: DevnetHandle, user_secret: str, item: str = "book", price: int = 7, *,
             valid_ledgers: int = 100, passphrase: str | None = None, signer_secret: str | None = None,
             expiration: int | None = None, upgraded: bool = True) -> tuple[str, str]:
    """The user's wallet: authorise market.buy(user, item, price). -> (args_xdr, auth entry b64).
    `signer_secret` signs as another account (e.g. a lane) for the bad-input tests; `upgraded=False`
    signs legacy ADDRESS (v1) credentials instead of ADDRESS_V2."""
    g = devnet.genesis
    user = Keypair.from_secret(user_secret)
    signer = Keypair.from_secret(signer_secret) if signer_secret else user
    args = buy_args(user.public_key, item, price)
    invocation = xdr.SorobanAuthorizedInvocation(
        function=xdr.SorobanAuthorizedFunction(
            type=xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
            contract_fn=xdr.InvokeContractArgs(contract_address=scval.to_address(g["contracts"]["market"]).address,
                                               function_name=xdr.SCSymbol(b"buy"), args=args)),
        sub_invocations=[])
    exp = expiration if expiration is not None else devnet.latest_ledger() + valid_ledgers
    entry = authorize_invocation(signer, None, exp, invocation, passphrase or g["passphrase"],
                                 credentials_type=credentials_type(upgraded))
    return scval.to_vec(args).to_xdr(), entry.to_xdr()


def admit_relay(db: psycopg.Connection, devnet: DevnetHandle, user: dict, key: str, item: str = "book",
                price: int = 7, *, max_fee: int = MAX_FEE, **sign: object) -> int:
    args, entry = sign_buy(devnet, user["secret"], item, price, **sign)  # type: ignore[arg-type]
    row = db.execute("SELECT relay_id FROM paygate.admit_relay(%s, %s, 'buy', %s, %s, %s, %s)",
                     (user["public"], devnet.genesis["contracts"]["market"], args, [entry], max_fee, key)).fetchone()
    return int(row[0])


def admit_close(db: psycopg.Connection, devnet: DevnetHandle, user: str, key: str | None = None) -> int:
    """A bot job: market.close_expired(user), deduped on the job key."""
    args = scval.to_vec([scval.to_address(user)]).to_xdr()
    row = db.execute("SELECT bot_job_id FROM paygate.admit_bot_job(%s, %s, 'close_expired', %s)",
                     (key or f"close:{user}", devnet.genesis["contracts"]["market"], args)).fetchone()
    return int(row[0])


def relay_rows(db: psycopg.Connection) -> dict[int, dict]:
    cursor = db.execute("SELECT * FROM paygate.relays ORDER BY id")
    names = [c.name for c in cursor.description]
    return {r[0]: dict(zip(names, r, strict=True)) for r in cursor.fetchall()}


def chain_fee(chain: ChainEnv, inner_hash: bytes) -> tuple[str, int | None]:
    """(status, feeCharged) of a transaction by its inner hash, as the chain says."""
    with chain.server() as server:
        tx = server.get_transaction(inner_hash.hex())
    if tx.status == GetTransactionStatus.NOT_FOUND:
        return "NOT_FOUND", None
    return tx.status.value, int(xdr.TransactionResult.from_xdr(tx.result_xdr).fee_charged.int64)


def assert_relay_invariants(chain: ChainEnv, db: psycopg.Connection) -> None:
    """After quiescence (the drill invariants (docs/architecture.md §1), proofs):
    - at most one applied lineage per relay / bot job (the journal's unique index, re-checked);
    - settled fees == the sum of feeCharged of our applied+failed relay transactions on chain (a
      relay settled from the chain alone, its lineage lost to a restore, by its reservation's hash);
    - every reservation settled or released (never both, never twice: one status column, CAS);
    - the accumulator agrees with the rows."""
    applied = db.execute("SELECT entitlement, count(*) FROM paygate.lineages WHERE purpose = 'relay' AND "
                         "state = 'applied' GROUP BY entitlement HAVING count(*) > 1").fetchall()
    assert applied == []
    included = db.execute("SELECT entitlement, inner_hash, state FROM paygate.lineages WHERE purpose = 'relay' "
                          "AND entitlement LIKE 'relay:%%' AND state IN ('applied', 'failed')").fetchall()
    on_chain = 0
    for _, inner, state in included:
        status, fee = chain_fee(chain, bytes(inner))
        assert status == ("SUCCESS" if state == "applied" else "FAILED"), (status, state)
        on_chain += fee or 0
    # Settled from the chain's receipt alone (a restore lost the lineage that sent it): the
    # reservation names the transaction.
    for (tx,) in db.execute("SELECT tx_hash FROM paygate.fee_reservations WHERE status = 'settled' "
                            "AND lineage_id IS NULL").fetchall():
        status, fee = chain_fee(chain, bytes(tx))
        assert status == "SUCCESS", (status, bytes(tx).hex())
        on_chain += fee or 0
    reservations = db.execute("SELECT status, count(*), coalesce(sum(fee_charged), 0), coalesce(sum(amount), 0) "
                              "FROM paygate.fee_reservations GROUP BY status").fetchall()
    by_status = {r[0]: r[1:] for r in reservations}
    assert "reserved" not in by_status, by_status
    settled = int(by_status.get("settled", (0, 0, 0))[1])
    assert settled == on_chain, (settled, on_chain)
    totals = db.execute("SELECT reserved, settled, released FROM paygate.relay_fee_totals").fetchone()
    assert totals == (0, settled, int(by_status.get("released", (0, 0, 0))[2]))
    relays = db.execute("SELECT status, count(*) FROM paygate.relays GROUP BY status").fetchall()
    assert "queued" not in dict(relays)
    # A relay's row agrees with its latest reservation (a replayed relay's earlier rounds were
    # released before it was replayed: never settled, see the count below).
    mismatched = db.execute("""
        SELECT r.id FROM paygate.relays r
        JOIN LATERAL (SELECT * FROM paygate.fee_reservations f WHERE f.relay_id = r.id
                      ORDER BY f.round DESC LIMIT 1) f ON true
        WHERE (r.status IN ('applied', 'failed')) <> (f.status = 'settled')
           OR (r.status IN ('applied', 'failed') AND r.fee_charged <> f.fee_charged)""").fetchall()
    assert mismatched == []
    assert db.execute("SELECT relay_id FROM paygate.fee_reservations WHERE status = 'settled' "
                      "GROUP BY relay_id HAVING count(*) > 1").fetchall() == []


def run_until_quiet(chain: ChainEnv, db: psycopg.Connection, worker: str = "relay", rounds: int = 15,
                    codes: tuple[int, ...] = (0, 1)) -> None:
    table = "relays" if worker == "relay" else "bot_jobs"
    for _ in range(rounds):
        result = chain.tick(worker)
        assert result.code in codes, result.err
        open_rows = db.execute(f"SELECT count(*) FROM paygate.{table} WHERE status = 'queued'").fetchone()[0]
        live = db.execute("SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated','signed','sent')"
                          ).fetchone()[0]
        if not open_rows and not live:
            return
        chain.devnet.close_ledger()
    raise AssertionError(f"{worker} did not go quiet")
