"""The devnet's friendbot, against Stellar's friendbot (stellar/go services/friendbot:
internal/friendbot_handler.go for the addr check and problem rendering, internal/minion.go for
CreateAccount vs Payment and "account already funded to starting balance", main.go for the problems it
registers and GET+POST on the route) and stellar-rpc's getNetwork `friendbotUrl`
(cmd/stellar-rpc/internal/methods/get_network.go)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from stellar_sdk import Keypair, SorobanServer, xdr
from stellar_sdk.soroban_rpc import GetTransactionStatus

from tests.devnet.helpers import call
from tests.support.devnet_support import DevnetHandle

STARTING = 10_000 * 10_000_000


def _get(url: str, data: bytes | None = None) -> tuple[int, str, dict]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers["Content-Type"], json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], json.loads(exc.read())


def _balance(server: SorobanServer, g: str) -> int:
    key = xdr.LedgerKey(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(
        account_id=Keypair.from_public_key(g).xdr_account_id()))
    [entry] = server.get_ledger_entries([key]).entries
    return xdr.LedgerEntryData.from_xdr(entry.xdr).account.balance.int64


def test_friendbot_creates_a_new_account_and_refuses_a_funded_one(server: SorobanServer,
                                                                  devnet: DevnetHandle) -> None:
    fb_url = server.get_network().friendbot_url
    assert fb_url == f"{devnet.url}/friendbot"
    new = Keypair.random().public_key
    status, ctype, body = _get(f"{fb_url}?addr={new}")
    assert status == 200 and ctype.startswith("application/hal+json"), body
    assert body["successful"] is True and body["hash"] == body["id"] and len(body["hash"]) == 64
    env = xdr.TransactionEnvelope.from_xdr(body["envelope_xdr"])
    assert env.v1.tx.operations[0].body.type == xdr.OperationType.CREATE_ACCOUNT
    got = server.get_transaction(body["hash"])
    assert got.status == GetTransactionStatus.SUCCESS and got.ledger == body["ledger"]
    assert _balance(server, new) == STARTING
    assert server.load_account(new).sequence == body["ledger"] << 32
    # Funded to the starting balance already: main.go registers ErrAccountFunded as a bad_request.
    status, ctype, body = _get(f"{fb_url}?addr={new}")
    assert status == 400 and ctype.startswith("application/problem+json")
    assert body == {"type": "https://stellar.org/horizon-errors/bad_request", "title": "Bad Request",
                    "status": 400, "detail": "account already funded to starting balance"}


def test_friendbot_tops_up_an_existing_account_with_a_payment(server: SorobanServer, devnet: DevnetHandle) -> None:
    poor = call(devnet.url, "devnet_createAccount", {"xlm": 10_000_000})["result"]["account"]
    status, _, body = _get(f"{devnet.url}/friendbot", data=urllib.parse.urlencode({"addr": poor}).encode())
    assert status == 200, body  # POST with a form body works like GET
    env = xdr.TransactionEnvelope.from_xdr(body["envelope_xdr"])
    assert env.v1.tx.operations[0].body.type == xdr.OperationType.PAYMENT  # minion.go makePaymentTx
    assert _balance(server, poor) == 10_000_000 + STARTING


def test_friendbot_rejects_bad_addresses_as_an_invalid_field(devnet: DevnetHandle) -> None:
    contract = devnet.genesis["contracts"]["usdc"]
    for query in ("addr=GNOPE", "addr=" + contract, "", "addr="):
        status, ctype, body = _get(f"{devnet.url}/friendbot?{query}")
        assert status == 400 and ctype.startswith("application/problem+json"), (query, body)
        assert body["type"] == "https://stellar.org/horizon-errors/bad_request"
        assert body["extras"]["invalid_field"] == "addr" and body["extras"]["reason"]
