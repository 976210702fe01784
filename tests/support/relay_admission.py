"""Relay admission in the tests: a user, a market contract, signed auth entries, `admit` (the API
service's call of paygate.admit_relay) and the `allowed` fixture (the market on the allow-list)."""

from __future__ import annotations

import psycopg
import pytest
from stellar_sdk import Keypair, StrKey, scval, xdr
from stellar_sdk.auth import authorize_invocation

USER = Keypair.random()
MARKET = StrKey.encode_contract(bytes(range(32)))
OTHER_CONTRACT = StrKey.encode_contract(bytes(32))
PASSPHRASE = "Standalone Network ; February 2017"


def args_xdr(item: str = "apple", price: int = 5) -> str:
    return scval.to_vec([scval.to_address(USER.public_key), scval.to_symbol(item), scval.to_int128(price)]).to_xdr()


def auth_entry(expiration: int = 500, nonce: int | None = None, *, signer: Keypair = USER,
               function: str = "buy", upgraded: bool = True) -> str:
    invocation = xdr.SorobanAuthorizedInvocation(
        function=xdr.SorobanAuthorizedFunction(
            type=xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
            contract_fn=xdr.InvokeContractArgs(contract_address=scval.to_address(MARKET).address,
                                               function_name=xdr.SCSymbol(function.encode()),
                                               args=list(xdr.SCVal.from_xdr(args_xdr()).vec.sc_vec))),
        sub_invocations=[])
    ct = xdr.SorobanCredentialsType
    entry = authorize_invocation(signer, None, expiration, invocation, PASSPHRASE, credentials_type=(
        ct.SOROBAN_CREDENTIALS_ADDRESS_V2 if upgraded else ct.SOROBAN_CREDENTIALS_ADDRESS))
    if nonce is not None:
        (entry.credentials.address_v2 or entry.credentials.address).nonce = xdr.Int64(nonce)
    return entry.to_xdr()


def source_account_entry() -> str:
    entry = xdr.SorobanAuthorizationEntry.from_xdr(auth_entry())
    entry.credentials = xdr.SorobanCredentials(xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT)
    return entry.to_xdr()


def admit(db: psycopg.Connection, key: str, *, entries: list[str] | None = None, max_fee: int = 1_000_000,
          function: str = "buy", contract: str = MARKET, args: str | None = None) -> tuple:
    return db.execute("SELECT relay_id, reserved_fee, replayed FROM paygate.admit_relay(%s, %s, %s, %s, %s, %s, %s)",
                      (USER.public_key, contract, function, args or args_xdr(), entries or [auth_entry()],
                       max_fee, key)).fetchone()


@pytest.fixture
def allowed(db: psycopg.Connection) -> psycopg.Connection:
    db.execute("INSERT INTO paygate.relay_allowlist (contract, function) VALUES (%s, 'buy')", (MARKET,))
    db.execute("INSERT INTO paygate.bot_job_allowlist (contract, function) VALUES (%s, 'close_expired')", (MARKET,))
    db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/h', "
               "'0123456789abcdef0123')")
    return db
