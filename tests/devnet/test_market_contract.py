"""The devnet market contract's relay-path functions: permissionless `close_expired(order)` for bot
jobs (the chain decides expiry) and the one-of-a-kind item whose second buy fails on chain."""

from __future__ import annotations

import pytest
from stellar_sdk import scval

from paygate_cli.sandbox.devnet.contracts.market import ORDER_TTL_LEDGERS
from tests.devnet.host_support import Env, a, contract_error, deploy, event, host_fn, kp

ISSUER, ALICE, BOB, LANE, ADMIN = kp(21), kp(22), kp(23), kp(24), kp(25)
BOUGHT_AT = 500


@pytest.fixture
def env() -> Env:
    return deploy(ISSUER, ADMIN, LANE)


def invoke(env: Env, fn: str, args: list, *, ledger: int, source=ALICE, auth=True, mode: str = "apply"):
    from tests.devnet.host_support import source_auth

    return env.host.invoke(host_function=host_fn(env.market, fn, args),
                           auth=[source_auth(env.market, fn, args)] if auth else [],
                           source_account=source.public_key, ledger_seq=ledger, ledger_close_time=ledger * 5,
                           mode=mode)


def test_close_expired_is_permissionless_and_only_after_the_order_window(env: Env) -> None:
    out = invoke(env, "buy", [a(ALICE), scval.to_symbol("book"), scval.to_int128(3)], ledger=BOUGHT_AT)
    assert out.ok, out.error
    order = a(ALICE)
    last_open = BOUGHT_AT + ORDER_TTL_LEDGERS
    assert contract_error(invoke(env, "close_expired", [order], ledger=last_open, source=LANE, auth=False), 4)
    # No authorisation entries at all, from a lane that is not the buyer: anyone may close it.
    closed = invoke(env, "close_expired", [order], ledger=last_open + 1, source=LANE, auth=False)
    assert closed.ok, closed.error
    assert scval.to_native(closed.return_value) == last_open
    assert [event(e) for e in closed.events] == [(env.market, ["order_closed", ALICE.public_key], last_open)]
    assert contract_error(invoke(env, "close_expired", [order], ledger=last_open + 2, source=LANE, auth=False), 3)
    assert contract_error(invoke(env, "close_expired", [a(BOB)], ledger=last_open, source=LANE, auth=False), 2)


def test_limited_item_sells_once_then_fails(env: Env) -> None:
    first = invoke(env, "buy", [a(ALICE), scval.to_symbol("limited"), scval.to_int128(9)], ledger=BOUGHT_AT)
    assert first.ok, first.error
    second = invoke(env, "buy", [a(BOB), scval.to_symbol("limited"), scval.to_int128(9)], ledger=BOUGHT_AT,
                    source=BOB)
    assert contract_error(second, 5) and second.events == []
