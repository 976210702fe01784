"""Lanes in the tests: what the billing admin can do to a lane behind paygate's back."""

from __future__ import annotations

from stellar_sdk import Keypair, TransactionBuilder, scval

from tests.support.chain_env import ChainEnv


def remove_operator(chain: ChainEnv, lane: str) -> None:
    """The billing admin takes a lane's operator right away (its key stays in our secrets file)."""
    g = chain.genesis
    admin = Keypair.from_secret(g["admin"]["secret"])
    with chain.server() as server:
        tx = (TransactionBuilder(server.load_account(admin.public_key), g["passphrase"], base_fee=100)
              .append_invoke_contract_function_op(g["contracts"]["billing"], "remove_operator",
                                                  [scval.to_address(admin.public_key), scval.to_address(lane)])
              .set_timeout(300).build())
        tx = server.prepare_transaction(tx)
        tx.sign(admin)
        assert server.send_transaction(tx).status.value == "PENDING"
    chain.devnet.close_ledger()
