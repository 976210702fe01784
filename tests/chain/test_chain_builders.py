"""chain/ builders that replace SDK helpers for speed must produce the SDK's exact bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from stellar_sdk import Account, Keypair, Network, SorobanDataBuilder, TransactionBuilder, scval

from paygate_cli.chain.contracts import fee_bump

PASSPHRASE = Network.STANDALONE_NETWORK_PASSPHRASE
CONTRACT = "CDYAT2YCKJDYQTVDXSFYW3CV3AXDMQIFAK3QVU6L6SKKPVRFDBDG6OAX"


@settings(max_examples=25, deadline=None)
@given(seq=st.integers(1, 2**40), resource_fee=st.integers(0, 10**7), inner_fee=st.integers(100, 150),
       bump_fee=st.integers(150, 10_000), max_time=st.integers(1, 2**32))
def test_fee_bump_is_byte_identical_to_the_sdk(seq: int, resource_fee: int, inner_fee: int, bump_fee: int,
                                               max_time: int) -> None:
    lane, fee = Keypair.random(), Keypair.random()
    tx = (TransactionBuilder(Account(lane.public_key, seq), PASSPHRASE, base_fee=inner_fee)
          .append_invoke_contract_function_op(CONTRACT, "balance", [scval.to_address(lane.public_key)])
          .add_time_bounds(0, max_time)
          .set_soroban_data(SorobanDataBuilder().set_resource_fee(resource_fee).set_resources(1, 2, 3).build())
          .build())
    tx.sign(lane)
    ours_xdr, ours_hash = fee_bump(tx, fee, bump_fee, PASSPHRASE)
    sdk = TransactionBuilder.build_fee_bump_transaction(fee.public_key, bump_fee, tx, PASSPHRASE)
    sdk.sign(fee)
    assert ours_xdr == sdk.to_xdr() and ours_hash == sdk.hash()
