"""Balance reads for the reconciler: the billing contract's `balance(account)` and a token's
`balance(holder)`, each with the ledger the answer describes (the simulation's latest ledger), so
the reconciler can line a balance up with the events that led to it; and whether the billing
contract credited a deposit hash (funding). Read-only: nothing is sent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paygate_cli.chain.rpc import ChainClient


def _read(chain: ChainClient, *, source: str, contract: str, function: str, address: str | None = None,
          value: bytes | None = None) -> tuple[Any, int]:
    """One read-only call with one argument: an address, or `value` as Bytes."""
    from stellar_sdk import Account, TransactionBuilder, scval

    from paygate_cli.chain.contracts import SimulationFailed, simulated_return_value

    arg = scval.to_address(address) if address is not None else scval.to_bytes(value or b"")
    what = address if address is not None else (value or b"").hex()
    # Simulation never checks the sequence number: a fixed one saves a getLedgerEntries per read.
    builder = TransactionBuilder(Account(source, 0), chain.passphrase, base_fee=100)
    tx = builder.append_invoke_contract_function_op(contract, function, [arg]).set_timeout(300).build()
    simulation = chain.simulate(tx)
    if simulation.error:
        raise SimulationFailed(f"{function}({what}) read failed: {simulation.error}"[:500])
    result = scval.to_native(simulated_return_value(simulation, function))
    return result, int(simulation.latest_ledger)


def billing_balance_at(chain: ChainClient, *, billing: str, account: str, source: str) -> tuple[int, int]:
    """-> (balance, ledger)."""
    value, ledger = _read(chain, source=source, contract=billing, function="balance", address=account)
    return int(value), ledger


def billing_credited(chain: ChainClient, *, billing: str, deposit_tx: bytes, source: str) -> bool:
    """Has the billing contract credited this deposit hash (`is_credited`)? Funding asks when its
    credit cannot be built, before it calls that a human's problem."""
    value, _ = _read(chain, source=source, contract=billing, function="is_credited", value=deposit_tx)
    return value is True


def token_balance_at(chain: ChainClient, *, token: str, holder: str, source: str) -> tuple[int, int]:
    """-> (balance, ledger): a SAC's balance of `holder` (a G- or C-address)."""
    value, ledger = _read(chain, source=source, contract=token, function="balance", address=holder)
    return int(value), ledger


def nonce_consumed_by_quorum(chain: ChainClient, account: str, nonce: int) -> tuple[bool | None, int | None,
                                                                                   dict[str, Any]]:
    """Is this authorisation nonce consumed on chain, as a majority of read endpoints see it?
    -> (True/False when a majority agrees, else None; the highest latest ledger seen; per endpoint).
    Used where a decision re-verifies an effect (replay): one endpoint's word is not enough."""
    from paygate_cli.chain.contracts import nonce_key
    from paygate_cli.endpoints import endpoint_name
    from paygate_cli.errors import Unavailable

    chain._guard("nonce quorum read")
    key = nonce_key(account, nonce)
    answers: dict[str, Any] = {}
    latest: int | None = None
    for url, srv in zip(chain.read_urls, chain.readers, strict=True):
        name = endpoint_name(url)  # keyed by host: the answers are printed, and a URL may carry a key
        try:
            answer = chain._retrying("getLedgerEntries", lambda srv=srv: srv.get_ledger_entries([key]), 2)
        except Unavailable as exc:
            answers[name] = f"error: {exc}"[:200]
            continue
        answers[name] = bool(answer.entries)
        latest = max(latest or 0, int(answer.latest_ledger))
    majority = len(chain.read_urls) // 2 + 1
    votes = [v for v in answers.values() if isinstance(v, bool)]
    for verdict in (True, False):
        if votes.count(verdict) >= majority:
            return verdict, latest, answers
    return None, latest, answers
