"""The relay path's chain side: XLM balances for the gas monitor, relay call building and the checks
of a user's authorisation entries that SQL cannot make (signature, network, who it authorises as)."""

from __future__ import annotations

from dataclasses import dataclass

from stellar_sdk import Keypair, xdr

from paygate_cli.chain.rpc import ChainClient

# LedgerHeader.base_reserve on pubnet and testnet (0.5 XLM) since protocol 11; RPC does not serve the
# header, and the devnet models the same value.
BASE_RESERVE = 5_000_000


@dataclass(frozen=True)
class XlmBalance:
    address: str
    exists: bool
    balance: int  # stroops
    reserve: int  # the minimum balance the account must keep (stroops)
    selling_liabilities: int
    ledger: int

    @property
    def spendable(self) -> int:
        return self.balance - self.reserve - self.selling_liabilities


def xlm_balances(chain: ChainClient, addresses: list[str]) -> dict[str, XlmBalance]:
    """One getLedgerEntries for every account; a missing account is reported, not raised."""
    keys = [xdr.LedgerKey(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(
        account_id=Keypair.from_public_key(a).xdr_account_id())) for a in addresses]
    answer = chain.ledger_entries(keys)
    latest = int(answer.latest_ledger)
    found: dict[str, XlmBalance] = {}
    for entry in answer.entries or []:
        account = xdr.LedgerEntryData.from_xdr(entry.xdr).account
        address = Keypair.from_raw_ed25519_public_key(account.account_id.account_id.ed25519.uint256).public_key
        sponsoring = sponsored = 0
        selling = 0
        if account.ext.v1 is not None:
            selling = int(account.ext.v1.liabilities.selling.int64)
            v2 = account.ext.v1.ext.v2
            if v2 is not None:
                sponsoring, sponsored = int(v2.num_sponsoring.uint32), int(v2.num_sponsored.uint32)
        entries = 2 + int(account.num_sub_entries.uint32) + sponsoring - sponsored
        found[address] = XlmBalance(address, True, int(account.balance.int64), entries * BASE_RESERVE, selling, latest)
    return {a: found.get(a, XlmBalance(a, False, 0, 0, 0, latest)) for a in addresses}
