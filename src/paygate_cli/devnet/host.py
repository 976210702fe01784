"""The devnet's Soroban "host": auth, contract storage and native contract models.

Stub of the fixed interface between the RPC layer and the host layer; the real
implementation follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from stellar_sdk import xdr


@dataclass
class InvokeOutcome:
    ok: bool
    error: str | None
    error_kind: str | None
    return_value: xdr.SCVal | None
    events: list[xdr.ContractEvent] = field(default_factory=list)
    read_only: list[xdr.LedgerKey] = field(default_factory=list)
    read_write: list[xdr.LedgerKey] = field(default_factory=list)
    auth: list[xdr.SorobanAuthorizationEntry] = field(default_factory=list)
    instructions: int = 0
    read_bytes: int = 0
    write_bytes: int = 0


class ContractHost:
    def __init__(self, network_passphrase: str) -> None:
        self.network_passphrase = network_passphrase

    def deploy_sac(self, asset_code: str, issuer: str) -> str:
        raise NotImplementedError

    def deploy_billing(self, admin: str, token: str, operators: list[str]) -> str:
        raise NotImplementedError

    def deploy_market(self, token: str) -> str:
        raise NotImplementedError

    def mint(self, sac: str, to: str, amount: int) -> None:
        raise NotImplementedError

    def token_balance(self, sac: str, holder: str) -> int:
        raise NotImplementedError

    def get_ledger_entry(
        self, key: xdr.LedgerKey, ledger_seq: int
    ) -> tuple[xdr.LedgerEntry, int | None] | None:
        raise NotImplementedError

    def invoke(
        self,
        *,
        host_function: xdr.HostFunction,
        auth: list[xdr.SorobanAuthorizationEntry],
        source_account: str,
        ledger_seq: int,
        ledger_close_time: int,
        mode: Literal["apply", "record", "enforce"],
        footprint: tuple[list[xdr.LedgerKey], list[xdr.LedgerKey]] | None = None,
    ) -> InvokeOutcome:
        raise NotImplementedError

    def snapshot(self) -> dict:
        raise NotImplementedError

    @classmethod
    def restore(cls, network_passphrase: str, data: dict) -> ContractHost:
        raise NotImplementedError
