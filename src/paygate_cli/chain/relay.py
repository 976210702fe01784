"""The relay path's chain side: XLM balances for the gas monitor, relay call building and the checks
of a user's authorisation entries that SQL cannot make (signature, network, who it authorises as)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stellar_sdk import Address, Keypair, scval, xdr

from paygate_cli.chain.contracts import (
    Invocation,
    LandedReceipt,
    SignedTransaction,
    authorising_transactions,
    landed_with_authorisation,
)
from paygate_cli.chain.rpc import ChainClient
from paygate_cli.errors import PaygateError

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
    return _xlm_balances_of(chain.ledger_entries(_account_keys(addresses)), addresses)


def xlm_balances_by_host(chain: ChainClient, addresses: list[str]) -> list[dict[str, XlmBalance] | str]:
    """xlm_balances as each distinct read host sees it (for a decision a majority must agree on):
    per host its balances, or why it gave none (no answer, or one that does not decode)."""
    from paygate_cli.endpoints import endpoint_name
    from paygate_cli.errors import Unavailable

    chain._guard("getLedgerEntries")
    keys = _account_keys(addresses)
    views: list[dict[str, XlmBalance] | str] = []
    for url, srv in zip(chain.read_urls, chain.readers, strict=True):
        try:
            answer = chain._retrying("getLedgerEntries", lambda srv=srv: srv.get_ledger_entries(keys), attempts=2)
            views.append(_xlm_balances_of(answer, addresses))
        except Unavailable as exc:
            views.append(f"{endpoint_name(url)}: {str(exc)[:200]}")
        except Exception as exc:  # an answer that does not decode is no view at all
            views.append(f"{endpoint_name(url)}: malformed answer ({type(exc).__name__})")
    return views


def _account_keys(addresses: list[str]) -> list[xdr.LedgerKey]:
    return [xdr.LedgerKey(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(
        account_id=Keypair.from_public_key(a).xdr_account_id())) for a in addresses]


def _xlm_balances_of(answer: Any, addresses: list[str]) -> dict[str, XlmBalance]:
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


class BadRelay(PaygateError):
    """The relay can never work as admitted; it is quarantined (`rejected`) with the reason."""

    msgid = "relay.rejected"


def bot_job_invocation(contract: str, function: str, args_xdr: str) -> Invocation:
    """A permissionless call queued as a bot job: it carries no authorisation entry, and the engine
    refuses the envelope if the simulation recorded any (chain/authority.py: not even the lane's own)."""
    args = xdr.SCVal.from_xdr(args_xdr).vec
    return Invocation(contract, function, list(args.sc_vec) if args else [], [])


def relay_invocation(*, account: str, contract: str, function: str, args_xdr: str, auth_entries: list[str],
                     nonces: list[int], expiration_ledger: int, passphrase: str,
                     own_accounts: set[str]) -> Invocation:
    """The deep checks admission cannot make in SQL, then the call to build. Every entry must be the
    user's own ADDRESS/ADDRESS_V2 authorisation of exactly this call, signed for this network, with
    the nonce and expiration admission recorded; an entry that would authorise as one of our lanes,
    the fee account or the billing contract (`own_accounts`) is refused (the gateway must never lend
    its own authority to a relay). The engine checks the signed envelope again (chain/authority.py)."""
    try:
        args_val = xdr.SCVal.from_xdr(args_xdr)
    except Exception as exc:  # any decode failure: the bytes are not an SCVal
        raise BadRelay(f"args are not an SCVal ({type(exc).__name__})") from None
    if args_val.type != xdr.SCValType.SCV_VEC or args_val.vec is None:
        raise BadRelay("args are not an SCVal vector")
    args = list(args_val.vec.sc_vec)
    entries = []
    for number, entry_b64 in enumerate(auth_entries, start=1):
        where = f"auth entry {number}"
        try:
            entry = xdr.SorobanAuthorizationEntry.from_xdr(entry_b64)
        except Exception as exc:  # any decode failure
            raise BadRelay(f"{where} is not a SorobanAuthorizationEntry ({type(exc).__name__})") from None
        creds = entry.credentials.address_v2 or entry.credentials.address
        if creds is None:
            raise BadRelay(f"{where} must carry the user's ADDRESS credentials "
                           f"({entry.credentials.type.name} would authorise as the transaction's source: a lane)")
        try:
            signer = Address.from_xdr_sc_address(creds.address).address
        except ValueError:
            raise BadRelay(f"{where} names an unsupported address kind") from None
        if signer in own_accounts:
            raise BadRelay(f"{where} authorises as {signer}, one of the gateway's own accounts")
        if signer != account:
            raise BadRelay(f"{where} is signed for {signer}, not the relay's account {account}")
        nonce, expiration = int(creds.nonce.int64), int(creds.signature_expiration_ledger.uint32)
        if nonce != nonces[number - 1] or expiration < expiration_ledger:
            raise BadRelay(f"{where}: nonce/expiration differ from the admitted relay")
        fn = entry.root_invocation.function.contract_fn
        if fn is None:
            raise BadRelay(f"{where} does not authorise a contract call")
        if (Address.from_xdr_sc_address(fn.contract_address).address != contract
                or fn.function_name.sc_symbol.decode(errors="replace") != function
                or [a.to_xdr() for a in fn.args] != [a.to_xdr() for a in args]):
            raise BadRelay(f"{where} authorises a different call than {function} on {contract}")
        if signer.startswith("G"):
            _verify_signature(entry, creds, signer, expiration, passphrase, where)
        entries.append(entry)
    return Invocation(contract, function, args, entries)


def _verify_signature(entry: xdr.SorobanAuthorizationEntry, creds: xdr.SorobanAddressCredentials, signer: str,
                      expiration: int, passphrase: str, where: str) -> None:
    """An account's entry is verifiable offline; a contract account's (custom auth) is left to
    simulation in enforce mode."""
    from stellar_sdk.auth import authorization_payload_hash, build_authorization_preimage
    from stellar_sdk.exceptions import BadSignatureError

    try:
        payload = authorization_payload_hash(build_authorization_preimage(entry, expiration, passphrase))
        signatures = scval.to_native(creds.signature)
        for sig in signatures:
            key = Keypair.from_raw_ed25519_public_key(sig["public_key"])
            if key.public_key != signer:
                continue
            try:
                key.verify(payload, sig["signature"])
                return
            except BadSignatureError:
                continue
    except (ValueError, TypeError, KeyError):
        raise BadRelay(f"{where}'s signature is not Vec<Map{{public_key, signature}}>") from None
    raise BadRelay(f"{where}'s signature does not verify for this network and account "
                   "(signed for another network, or not by the account)")


def nonces_consumed(chain: ChainClient, account: str, nonces: list[int]) -> tuple[list[int], int]:
    """(the nonces of `account` already consumed on chain, latest ledger of that read)."""
    consumed, latest = nonces_consumed_many(chain, [(account, nonces)])
    return consumed[0], latest


def nonces_consumed_many(chain: ChainClient, wanted: list[tuple[str, list[int]]]) -> tuple[list[list[int]], int]:
    """One getLedgerEntries for the nonces of several relays (a tick's batch): per item, the nonces
    consumed on chain, and the latest ledger of that one read."""
    from paygate_cli.chain.contracts import nonce_key

    keys = {nonce_key(account, n).to_xdr(): (account, n) for account, nonces in wanted for n in nonces}
    answer = chain.ledger_entries([xdr.LedgerKey.from_xdr(k) for k in keys])
    consumed: set[tuple[str, int]] = set()
    for entry in answer.entries or []:
        # From the entry itself, not its echoed key: what was found is what counts.
        data = xdr.LedgerEntryData.from_xdr(entry.xdr).contract_data
        if data is not None and data.key.nonce_key is not None:
            consumed.add((Address.from_xdr_sc_address(data.contract).address, int(data.key.nonce_key.nonce.int64)))
    return [[n for n in nonces if (account, n) in consumed] for account, nonces in wanted], int(answer.latest_ledger)


def landed_relay(chain: ChainClient, *, account: str, nonce: int, fee_account: str) -> LandedReceipt | None:
    """The transaction of this gateway's that consumed a relay's authorisation nonce, proven from the
    chain: one that carries `account`'s authorisation with this nonce (found in the ledger that wrote
    the nonce), landed as a majority of the read endpoints show it, fee-bumped by our fee account
    (so it was ours and its fee is ours to settle). None when the chain cannot show one: then the
    nonce was spent by someone else, or beyond the read hosts' history, and a human decides."""
    for inner_hash in authorising_transactions(chain, account, nonce):
        receipt = landed_with_authorisation(chain, inner_hash, account=account, nonce=nonce)
        if receipt is not None and receipt.fee_source == fee_account:
            return receipt
    return None


def envelope_fee(signed: SignedTransaction) -> int:
    """The most the fee account can be charged for this envelope (the fee bump's fee): as built when
    build_signed knows it, else decoded from the envelope."""
    if signed.fee is not None:
        return signed.fee
    return int(xdr.TransactionEnvelope.from_xdr(signed.envelope_xdr).fee_bump.tx.fee.int64)
