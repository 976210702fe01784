"""The devnet's fast Transaction decoder must build exactly what the SDK's decoder builds, and must
never accept bytes the SDK rejects (it falls back to the SDK on anything it does not handle)."""

from __future__ import annotations

import hashlib
import random

import pytest
from stellar_sdk import Account, Asset, Keypair, Network, SorobanDataBuilder, StrKey, TransactionBuilder, scval, xdr
from stellar_sdk.auth import authorize_invocation

from paygate_cli.sandbox.devnet.fastxdr import decode_transaction

PASS = Network.STANDALONE_NETWORK_PASSPHRASE
KP = [Keypair.from_raw_ed25519_seed(bytes([i]) * 32) for i in range(1, 6)]
CONTRACT = StrKey.encode_contract(hashlib.sha256(b"billing").digest())


def _key(i: int) -> xdr.LedgerKey:
    return xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_DATA, contract_data=xdr.LedgerKeyContractData(
        contract=scval.to_address(CONTRACT).address,
        key=scval.to_vec([scval.to_symbol("Charged"), scval.to_bytes(bytes([i]) * 32)]),
        durability=xdr.ContractDataDurability.PERSISTENT))


def _envelopes() -> list[bytes]:
    out = []
    src = Account(KP[0].public_key, 1 << 32)
    batch = [scval.to_address(KP[0].public_key),
             scval.to_vec([scval.to_address(k.public_key) for k in KP]),
             scval.to_vec([scval.to_int128(-(2**100) + i) for i in range(5)]),
             scval.to_vec([scval.to_bytes(bytes([i]) * 32) for i in range(5)])]
    data = (SorobanDataBuilder().set_resource_fee(123_456).set_resources(1_000_000, 2_000, 3_000)
            .set_read_only([_key(1), xdr.LedgerKey(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(
                KP[1].xdr_account_id()))]).set_read_write([_key(2), _key(3)]).build())
    tx = (TransactionBuilder(src, PASS, base_fee=100)
          .append_invoke_contract_function_op(CONTRACT, "charge_batch", batch)
          .set_timeout(30).set_soroban_data(data).build())
    tx.sign(KP[0])
    out.append(tx.to_xdr_object().v1.to_xdr_bytes())
    fb = TransactionBuilder.build_fee_bump_transaction(KP[1].public_key, 300, tx, PASS)
    out.append(fb.to_xdr_object().fee_bump.tx.inner_tx.v1.to_xdr_bytes())
    inv = xdr.SorobanAuthorizedInvocation(
        function=xdr.SorobanAuthorizedFunction(
            type=xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
            contract_fn=xdr.InvokeContractArgs(contract_address=scval.to_address(CONTRACT).address,
                                               function_name=xdr.SCSymbol(b"buy"),
                                               args=[scval.to_symbol("coffee"), scval.to_uint64(7),
                                                     scval.to_uint32(3), scval.to_string("x"),
                                                     scval.to_map({scval.to_symbol("k"): scval.to_bool(True)})])),
        sub_invocations=[])
    inv.sub_invocations.append(xdr.SorobanAuthorizedInvocation(function=inv.function, sub_invocations=[]))
    for ct in (xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_ADDRESS,
               xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_ADDRESS_V2):
        entry = authorize_invocation(KP[2], None, 99, inv, PASS, credentials_type=ct)
        tx = (TransactionBuilder(src, PASS, base_fee=100)
              .append_invoke_contract_function_op(CONTRACT, "buy", [scval.to_address(KP[2].public_key)], auth=[entry],
                                                  source=KP[3].public_key)
              .set_timeout(30).set_soroban_data(data).build())
        out.append(tx.to_xdr_object().v1.to_xdr_bytes())
    classic = (TransactionBuilder(src, PASS, base_fee=100).append_payment_op(KP[1].public_key, Asset.native(), "1")
               .append_bump_sequence_op(5).add_text_memo("memo").set_ledger_bounds(1, 9).add_time_bounds(0, 99)
               .build())
    out.append(classic.to_xdr_object().v1.to_xdr_bytes())
    return out


def _sdk(raw: bytes) -> tuple[xdr.Transaction, int]:
    from xdrlib3 import Unpacker

    u = Unpacker(raw)
    tx = xdr.Transaction.unpack(u)
    return tx, u.get_position()


@pytest.mark.parametrize("i", range(5))
def test_fast_decode_equals_the_sdk(i: int) -> None:
    raw = _envelopes()[i]
    fast, end = decode_transaction(raw, 0)
    sdk, sdk_end = _sdk(raw)
    assert fast == sdk and end == sdk_end
    assert fast.to_xdr_bytes() == raw[:end]


def test_fast_decode_never_accepts_what_the_sdk_rejects() -> None:
    rng = random.Random(11)
    envelopes = _envelopes()
    checked = 0
    for _ in range(600):
        b = bytearray(rng.choice(envelopes))
        if rng.random() < 0.3:
            b = b[: rng.randrange(1, len(b))]
        else:
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        raw = bytes(b)
        try:
            fast = decode_transaction(raw, 0)
        except Exception:
            continue  # the devnet falls back to the SDK, which decides
        sdk = _sdk(raw)  # must not raise: the fast path accepted it
        assert fast == sdk
        checked += 1
    assert checked > 100
