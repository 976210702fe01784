"""A deposit end to end with both Soroban address-credential versions a wallet can produce.

stellar-rpc records legacy SOROBAN_CREDENTIALS_ADDRESS (v1) entries unless a client asks for
ADDRESS_V2 with `useUpgradedAuth: true` (cmd/stellar-rpc/internal/methods/simulate_transaction.go,
lib/preflight/src/shared.rs), so a wallet on an older SDK hands paygate v1 entries and a current one
v2 (CAP-71: the preimage also binds the address). Funding must accept, submit and settle both, and
the observer must read the resulting credit without quarantining it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Keypair, StrKey, xdr

from paygate_cli.sandbox.devnet.wallet import sign_deposit
from tests.support.chain_env import ChainEnv, admit_deposit, billing_balance, chain_environ, contract_events
from tests.support.devnet_support import DevnetHandle, start_devnet

AMOUNT = 12_000_000
CT = xdr.SorobanCredentialsType


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=2)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


@pytest.mark.parametrize("upgraded,ctype", [(False, CT.SOROBAN_CREDENTIALS_ADDRESS),
                                            (True, CT.SOROBAN_CREDENTIALS_ADDRESS_V2)], ids=["ADDRESS", "ADDRESS_V2"])
def test_deposit_settles_with_either_credential_version(chain: ChainEnv, db: psycopg.Connection, upgraded: bool,
                                                        ctype: xdr.SorobanCredentialsType) -> None:
    g = chain.genesis
    user = g["users"][0]
    expiration = chain.devnet.latest_ledger() + 100
    entry, nonce = sign_deposit(user_secret=user["secret"], amount=AMOUNT, usdc=g["contracts"]["usdc"],
                                billing=g["contracts"]["billing"], passphrase=g["passphrase"],
                                expiration_ledger=expiration, upgraded=upgraded)
    assert xdr.SorobanAuthorizationEntry.from_xdr(entry).credentials.type == ctype
    pending_id = admit_deposit(db, user["public"], AMOUNT, entry, nonce, expiration, f"dep-{upgraded}")
    for _ in range(12):
        result = chain.tick("funding")
        assert result.code in (0, 1, 3), result.err
        status = db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (pending_id,)).fetchone()[0]
        if status != "pending":
            break
        chain.devnet.close_ledger()
    row = db.execute("SELECT status, deposit_tx FROM paygate.deposits WHERE id = %s", (pending_id,)).fetchone()
    assert row[0] == "settled", row
    assert billing_balance(chain, user["public"]) == AMOUNT
    # What landed on chain carries the wallet's own credential version (paygate did not re-shape it).
    with chain.server() as server:
        landed = server.get_transaction(bytes(row[1]).hex())
    env = xdr.TransactionEnvelope.from_xdr(landed.envelope_xdr)
    inner = env.fee_bump.tx.inner_tx.v1.tx if env.fee_bump is not None else env.v1.tx
    [auth] = inner.operations[0].body.invoke_host_function_op.auth
    assert auth.credentials.type == ctype
    [credit] = contract_events(chain, "credit")
    assert credit["value"][1] == bytes(row[1])
    observed = chain.tick("observer", PAYGATE_OBSERVER_START_LEDGER="1")
    assert observed.code == 0, observed.err
    quarantined = db.execute("SELECT count(*) FROM paygate.chain_events WHERE quarantined").fetchone()[0]
    assert quarantined == 0
    assert db.execute("SELECT count(*) FROM paygate.chain_events WHERE kind = 'credit'").fetchone()[0] == 1


# -- admission and the funding worker's deep check, per version (no chain needed) --------------------

PASSPHRASE = "Standalone Network ; February 2017"
USDC = StrKey.encode_contract(bytes(range(32)))
BILLING = StrKey.encode_contract(bytes(range(1, 33)))


def wallet_entry(user: Keypair, upgraded: bool, expiration: int = 4321) -> tuple[str, int]:
    return sign_deposit(user_secret=user.secret, amount=AMOUNT, usdc=USDC, billing=BILLING, passphrase=PASSPHRASE,
                        expiration_ledger=expiration, upgraded=upgraded)


@pytest.mark.parametrize("upgraded,ctype", [(False, CT.SOROBAN_CREDENTIALS_ADDRESS),
                                            (True, CT.SOROBAN_CREDENTIALS_ADDRESS_V2)], ids=["ADDRESS", "ADDRESS_V2"])
def test_admission_stores_either_version_as_signed(db: psycopg.Connection, upgraded: bool,
                                                  ctype: xdr.SorobanCredentialsType) -> None:
    """admit_deposit checks only the base64 shape (the deep checks run in the funding worker): both
    versions are admitted, the entry is stored byte for byte, and a replay finds the same row."""
    user = Keypair.random()
    entry, nonce = wallet_entry(user, upgraded)
    assert xdr.SorobanAuthorizationEntry.from_xdr(entry).credentials.type == ctype
    pending_id = admit_deposit(db, user.public_key, AMOUNT, entry, nonce, 4321, "k")
    assert admit_deposit(db, user.public_key, AMOUNT, entry, nonce, 4321, "k") == pending_id
    assert db.execute("SELECT auth_entry, auth_nonce, auth_expiration_ledger, status FROM paygate.deposits "
                      "WHERE id = %s", (pending_id,)).fetchone() == (entry, nonce, 4321, "pending")


@pytest.mark.parametrize("upgraded", [False, True], ids=["ADDRESS", "ADDRESS_V2"])
def test_the_deep_check_verifies_either_version_against_its_own_preimage(upgraded: bool) -> None:
    """check_deposit_auth accepts both versions (nonce and expiration read from either arm), and the
    signature is checked against the preimage of the entry's own version: the same signature
    relabelled as the other version (v2's preimage binds the address, v1's does not) is refused."""
    from paygate_cli.chain.contracts import BadAuthorization, check_deposit_auth

    user = Keypair.random()
    entry, nonce = wallet_entry(user, upgraded, expiration=777)
    checked = check_deposit_auth(entry, account=user.public_key, amount=AMOUNT, usdc=USDC, billing=BILLING,
                                 passphrase=PASSPHRASE)
    assert (checked.nonce, checked.expiration_ledger) == (nonce, 777)
    relabelled = xdr.SorobanAuthorizationEntry.from_xdr(entry)
    creds = relabelled.credentials.address_v2 or relabelled.credentials.address
    relabelled.credentials = (xdr.SorobanCredentials(CT.SOROBAN_CREDENTIALS_ADDRESS, address=creds) if upgraded
                              else xdr.SorobanCredentials(CT.SOROBAN_CREDENTIALS_ADDRESS_V2, address_v2=creds))
    with pytest.raises(BadAuthorization, match="does not verify"):
        check_deposit_auth(relabelled.to_xdr(), account=user.public_key, amount=AMOUNT, usdc=USDC, billing=BILLING,
                           passphrase=PASSPHRASE)
