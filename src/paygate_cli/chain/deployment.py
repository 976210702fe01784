"""What `paygate doctor` reads of the chain side of a deployment (ops/doctor.py): each RPC endpoint's
own facts (getHealth and getNetwork, asked over plain HTTP as `status` does) and the billing
contract's operators, read from its instance storage (the layout of
sandbox/devnet/contracts/billing.py: instance key `Operators`, a Vec of addresses, the allow-list
`charge_batch` and `credit` check their operator against). Reads only: nothing is simulated or sent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paygate_cli.errors import Unavailable

if TYPE_CHECKING:
    from paygate_cli.chain.rpc import ChainClient


@dataclass(frozen=True)
class EndpointFacts:
    """One endpoint's answers to getHealth and getNetwork (None: it did not say)."""

    status: str
    latest_ledger: int
    oldest_ledger: int
    latest_close_time: int | None
    retention_window: int | None  # getHealth ledgerRetentionWindow
    passphrase: str
    protocol_version: int | None


def _int_or_none(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def endpoint_facts(url: str, timeout: float) -> EndpointFacts:
    """getHealth, getNetwork and (when getHealth has no close time) getLatestLedger of one endpoint,
    each one request without retries (a probe: the caller reports what failed). Raises Unavailable
    naming the method; never the URL (callers name the endpoint by its host)."""
    from paygate_cli.chain.accounts import MalformedAnswer, NoAnswer, RpcErrorAnswer, urllib_endpoint

    endpoint = urllib_endpoint(url, timeout)

    def ask(method: str) -> dict[str, Any]:
        try:
            result = endpoint.post(method, {})
        except (NoAnswer, MalformedAnswer, RpcErrorAnswer) as exc:
            raise Unavailable(f"{method}: {exc}"[:300], msgid="rpc.unavailable") from None
        if not isinstance(result, dict):
            raise Unavailable(f"{method}: the answer's result is not an object", msgid="rpc.malformed")
        return result

    health, network = ask("getHealth"), ask("getNetwork")
    latest, oldest = _int_or_none(health.get("latestLedger")), _int_or_none(health.get("oldestLedger"))
    if not isinstance(health.get("status"), str) or latest is None or oldest is None:
        raise Unavailable("getHealth: the result lacks status, latestLedger or oldestLedger", msgid="rpc.malformed")
    if not isinstance(network.get("passphrase"), str):
        raise Unavailable("getNetwork: the result has no passphrase", msgid="rpc.malformed")
    close_time = _int_or_none(health.get("latestLedgerCloseTime"))
    if close_time is None:
        close_time = _int_or_none(ask("getLatestLedger").get("closeTime"))
    return EndpointFacts(health["status"], latest, oldest, close_time,
                         _int_or_none(health.get("ledgerRetentionWindow")), network["passphrase"],
                         _int_or_none(network.get("protocolVersion")))


def billing_operators(chain: ChainClient, billing: str) -> frozenset[str]:
    """The operator allow-list of the billing contract, from its instance entry's storage. Unavailable
    when the instance is not on chain or holds no `Operators` list (not the contract paygate drives)."""
    from stellar_sdk import StrKey, xdr

    from paygate_cli.chain.ttl import instance_key

    answer = chain.ledger_entries([instance_key(billing)])
    entries = answer.entries or []
    if not entries:
        raise Unavailable(f"the billing contract {billing} has no instance on chain", msgid="doctor.no_instance")
    try:
        storage = xdr.LedgerEntryData.from_xdr(entries[0].xdr).contract_data.val.instance.storage
    except Exception as exc:  # foreign bytes: the node is outside paygate
        raise Unavailable(f"the instance of {billing} does not decode ({type(exc).__name__})",
                          msgid="rpc.malformed") from None
    for item in (storage.sc_map if storage is not None else []) or []:
        if item.key.type == xdr.SCValType.SCV_SYMBOL and item.key.sym.sc_symbol == b"Operators":
            operators = set()
            for value in (item.val.vec.sc_vec if item.val.vec is not None else []):
                address = value.address
                if address is not None and address.type == xdr.SCAddressType.SC_ADDRESS_TYPE_ACCOUNT:
                    operators.add(StrKey.encode_ed25519_public_key(address.account_id.account_id.ed25519.uint256))
            return frozenset(operators)
    raise Unavailable(f"the instance of {billing} holds no Operators list", msgid="doctor.no_operators")


def lane_addresses(settings: Any) -> list[str]:
    """The public addresses of the lane seeds in PAYGATE_LANE_SECRETS_FILE ([] when it is not loaded);
    the seeds themselves stay in the Secret (each is remembered for the scrubber)."""
    from stellar_sdk import Keypair

    from paygate_cli.errors import ConfigError
    from paygate_cli.secrets import remember

    secret = settings.secret("lane_secrets")
    if secret is None:
        return []
    addresses = []
    for number, line in enumerate(secret.reveal().splitlines(), start=1):
        line = line.strip()
        if line and not line.startswith("#"):
            remember(line)
            try:
                addresses.append(Keypair.from_secret(line).public_key)
            except Exception:  # the SDK's own seed check; the message names the line, never the value
                raise ConfigError(f"{secret.source} line {number}: not a valid Stellar secret seed (S…)") from None
    return addresses
