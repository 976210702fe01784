"""Transaction builders for the devnet tests, the way paygate's chain layer will build them
(as stellar-sdk documents it): simulate/prepare with SorobanServer, sign, fee-bump with the fee account."""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.request
from typing import Any

from stellar_sdk import (
    FeeBumpTransactionEnvelope,
    Keypair,
    SorobanServer,
    TransactionBuilder,
    TransactionEnvelope,
    scval,
    xdr,
)
from stellar_sdk.auth import authorize_entry

from tests.support.devnet_support import DevnetHandle


def kp(pair: dict[str, str]) -> Keypair:
    return Keypair.from_secret(pair["secret"])


def raw(url: str, body: bytes | str | dict | list, timeout: float = 10.0) -> tuple[int, Any]:
    """POST raw bytes (or JSON) and return (HTTP status, parsed JSON or text)."""
    data = body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def call(url: str, method: str, params: Any = None) -> dict:
    """A raw JSON-RPC call; returns the whole response object."""
    status, body = raw(url, {"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
    assert status == 200, (status, body)
    return body


def invoke_tx(server: SorobanServer, dev: DevnetHandle, source: Keypair, contract: str, fn: str,
              args: list[xdr.SCVal], *, signers: list[Keypair] = (), timeout: int = 300,
              base_fee: int = 100, prepare: bool = True) -> TransactionEnvelope:
    """Build, simulate/prepare and sign an invocation from `source`; address-credential auth entries
    from the simulation are signed by the matching `signers`."""
    account = server.load_account(source.public_key)
    tx = (TransactionBuilder(account, dev.passphrase, base_fee=base_fee)
          .append_invoke_contract_function_op(contract, fn, args)
          .set_timeout(timeout).build())
    if not prepare:
        return tx
    sim = server.simulate_transaction(tx)
    assert sim.error is None, sim.error
    if signers and sim.results and sim.results[0].auth:
        latest = server.get_latest_ledger().sequence
        by_pk = {s.public_key: s for s in signers}
        signed = []
        for b64 in sim.results[0].auth:
            entry = xdr.SorobanAuthorizationEntry.from_xdr(b64)
            creds = entry.credentials.address_v2 or entry.credentials.address
            if creds is None:
                signed.append(entry)
                continue
            from stellar_sdk import Address

            who = Address.from_xdr_sc_address(creds.address).address
            signed.append(authorize_entry(entry, by_pk[who], latest + 50, dev.passphrase))
        tx.transaction.operations[0].auth = signed
        sim = server.simulate_transaction(tx)  # enforce mode now that auth is present
        assert sim.error is None, sim.error
    tx = server.prepare_transaction(tx, sim)
    tx.sign(source)
    return tx


def fee_bump(dev: DevnetHandle, inner: TransactionEnvelope, base_fee: int = 200) -> FeeBumpTransactionEnvelope:
    fee = kp(dev.genesis["fee_account"])
    fb = TransactionBuilder.build_fee_bump_transaction(fee.public_key, base_fee, inner, dev.passphrase)
    fb.sign(fee)
    return fb


def result_code(b64: str) -> str:
    return xdr.TransactionResult.from_xdr(b64).result.code.name


def inner_code(b64: str) -> str:
    r = xdr.TransactionResult.from_xdr(b64)
    return r.result.inner_result_pair.result.result.code.name


def bytes32(tag: str) -> bytes:
    return hashlib.sha256(tag.encode()).digest()


def b64_scval(v: xdr.SCVal) -> str:
    return base64.b64encode(v.to_xdr_bytes()).decode()


def addr(g: str) -> xdr.SCVal:
    return scval.to_address(g)
