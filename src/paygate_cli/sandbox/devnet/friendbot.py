"""`GET /friendbot?addr=G…` (and POST with a form body), as Stellar's friendbot answers it
(stellar/go services/friendbot: internal/friendbot_handler.go, internal/minion.go, main.go).

The bot is a real account of the devnet (key `{seed}:friendbot`, created on first use with a large
balance): it sends a real CreateAccount of the starting balance (10,000 XLM) to a new address, or a
native Payment of it to an existing account holding less, through the normal queue, and answers
once the transaction is applied (horizon's submission is synchronous). In manual mode it closes a
ledger for that, so a test that counts ledgers should fund before it counts.

Answers: 200 with the horizon Transaction resource (`hash`, `ledger`, `successful`, `envelope_xdr`,
`result_xdr`, `result_meta_xdr`, …) as `application/hal+json`; 400 problems
(`application/problem+json`) for an address that is not a G… account id (`extras.invalid_field =
"addr"`) and for an account already holding the starting balance (detail "account already funded to
starting balance"); a 500 problem if the transaction is refused or fails.
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stellar_sdk import Account as SdkAccount
from stellar_sdk import Asset, Keypair, StrKey, TransactionBuilder

from paygate_cli.sandbox.devnet import fees
from paygate_cli.sandbox.devnet.validate import parse_envelope

if TYPE_CHECKING:
    from paygate_cli.sandbox.devnet.ledger import Devnet, TxRecord

STARTING_BALANCE = 10_000 * 10_000_000  # friendbot.cfg starting_balance "10000.00", in stroops
BOT_BALANCE = 100_000_000 * 10_000_000  # enough for ten thousand fundings
PROBLEM_BASE = "https://stellar.org/horizon-errors/"  # support/render/problem's default type prefix


@dataclass
class Answer:
    status: int
    content_type: str
    body: dict[str, Any]


def problem(status: int, kind: str, title: str, detail: str, extras: dict[str, Any] | None = None) -> Answer:
    body: dict[str, Any] = {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail}
    if extras:
        body["extras"] = extras
    return Answer(status, "application/problem+json; charset=utf-8", body)


def bad_address(reason: str) -> Answer:
    """problem.MakeInvalidFieldProblem("addr", err): the generic bad_request with the field and reason."""
    return problem(400, "bad_request", "Bad Request", "The request you sent was invalid in some way.",
                   {"invalid_field": "addr", "reason": reason})


def parse_addr(raw_query: str) -> tuple[str | None, Answer | None]:
    """The `addr` form value, unescaped once more like loadAddress does, checked as a G… strkey."""
    values = urllib.parse.parse_qs(raw_query, keep_blank_values=True).get("addr", [""])
    addr = urllib.parse.unquote(values[0])
    if not addr:
        return None, bad_address("strkey is 0 bytes long; minimum valid length is 5")
    if not StrKey.is_valid_ed25519_public_key(addr):
        return None, bad_address("invalid version byte" if StrKey.is_valid_contract(addr)
                                 else "base32 decode failed: illegal base32 data")
    return addr, None


def bot_keypair(dev: Devnet) -> Keypair:
    from paygate_cli.sandbox.devnet.genesis import keypair

    return keypair(str(dev.genesis.get("seed", "paygate")), "friendbot")


def already_funded(dev: Devnet, addr: str) -> Answer | None:
    acct = dev.accounts.get(addr)
    if acct is not None and acct.balance >= STARTING_BALANCE:
        # main.go registerProblems: ErrAccountFunded is a bad_request with this detail.
        return problem(400, "bad_request", "Bad Request", "account already funded to starting balance")
    return None


def build_funding(dev: Devnet, addr: str) -> str:
    """The bot's signed transaction: CreateAccount for a new address, a native Payment otherwise
    (minion.go makeTx), infinite time bounds, base fee. Creates the bot account on first use."""
    bot = bot_keypair(dev)
    if bot.public_key not in dev.accounts:
        dev.create_account(bot.public_key, BOT_BALANCE)
        dev.secrets[bot.public_key] = bot.secret
    acct = dev.accounts[bot.public_key]
    tb = TransactionBuilder(SdkAccount(bot.public_key, acct.seq), dev.passphrase, base_fee=fees.BASE_FEE)
    amount = str(STARTING_BALANCE // 10_000_000)
    if addr in dev.accounts:
        tb.append_payment_op(addr, Asset.native(), amount)
    else:
        tb.append_create_account_op(addr, amount)
    tx = tb.add_time_bounds(0, 0).build()  # infinite, as txnbuild.NewInfiniteTimeout()
    tx.sign(bot)
    return tx.to_xdr()


def submit(dev: Devnet, envelope: str) -> tuple[str, str]:
    """-> (sendTransaction status, hash) through the devnet's normal admission."""
    p = parse_envelope(envelope, dev.net_id)
    status, _err = dev.submit(p)
    return status, p.full_hash.hex()


def success(dev: Devnet, r: TxRecord, url: str) -> Answer:
    """The horizon Transaction resource friendbot renders (hal.Render): the fields clients read."""
    ct = dt.datetime.fromtimestamp(r.created_at, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    bot = bot_keypair(dev).public_key
    body = {
        "_links": {"transaction": {"href": f"{url}/transactions/{r.full_hash}"}},
        "id": r.full_hash, "hash": r.full_hash, "ledger": r.ledger, "created_at": ct,
        "successful": r.status == "SUCCESS", "source_account": bot, "fee_account": bot,
        "fee_charged": str(fees.BASE_FEE), "max_fee": str(fees.BASE_FEE), "operation_count": 1,
        "envelope_xdr": r.envelope_xdr, "result_xdr": r.result_xdr, "result_meta_xdr": r.result_meta_xdr,
        "memo_type": "none",
    }
    if r.status != "SUCCESS":
        return problem(500, "transaction_failed", "Transaction Failed",
                       "The transaction failed when submitted to the stellar network.",
                       {"envelope_xdr": r.envelope_xdr, "result_xdr": r.result_xdr})
    return Answer(200, "application/hal+json; charset=utf-8", body)
