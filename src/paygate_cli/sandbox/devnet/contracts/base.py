"""What a native contract model sees of the host: storage, auth, events, strict argument decoding."""

from __future__ import annotations

from typing import Any

from stellar_sdk import xdr

from ..auth import AuthContext
from ..storage import Entry, Staging, StorageTrap, ValueTrap, enc_scaddress

_SCV = xdr.SCValType
_EXT0 = xdr.ExtensionPoint(0)


class ContractTrap(StorageTrap):
    """`panic_with_error!(env, Error::X)` in a real contract: Error(Contract, #n)."""

    def __init__(self, n: int, detail: str) -> None:
        super().__init__(f"Contract, #{n}", detail)


class Ctx:
    """One contract call frame (the models never make nested calls)."""

    __slots__ = (
        "args",
        "auth",
        "contract",
        "contract_addr",
        "contract_id",
        "events",
        "fn",
        "instance",
        "instance_key",
        "instructions",
        "ledger_seq",
        "staging",
    )

    def __init__(
        self,
        *,
        staging: Staging,
        auth: AuthContext,
        contract: bytes,
        contract_addr: xdr.SCAddress,
        fn: bytes,
        args: list[xdr.SCVal],
        instance: Entry,
        instance_key: bytes,
    ) -> None:
        self.staging = staging
        self.auth = auth
        self.contract = contract  # SCAddress XDR of the called contract
        self.contract_addr = contract_addr
        self.contract_id = xdr.ContractID(xdr.Hash(contract[4:]))
        self.fn = fn
        self.args = args
        self.instance = instance
        self.instance_key = instance_key
        self.events: list[xdr.ContractEvent] = []
        self.instructions = 0
        self.ledger_seq = staging.ledger_seq

    def get(self, key: bytes) -> Entry | None:
        return self.staging.get(key)

    def put(self, key: bytes, kind: str, val: Any, live_until: int | None = None) -> None:
        self.staging.put(key, kind, val, live_until)

    def set_instance(self, val: dict[str, Any]) -> None:
        self.staging.put(self.instance_key, "instance", val)
        self.instance = Entry("instance", val, self.instance.live_until, self.ledger_seq)

    def require_auth(self, address: bytes) -> None:
        """`address.require_auth()`: authorises this call with its full argument list."""
        self.auth.require_auth(address, self.contract_addr, self.contract, self.fn, self.args)

    def emit(self, topics: list[xdr.SCVal], data: xdr.SCVal) -> None:
        self.events.append(
            xdr.ContractEvent(
                ext=_EXT0,
                contract_id=self.contract_id,
                type=xdr.ContractEventType.CONTRACT,
                body=xdr.ContractEventBody(0, v0=xdr.ContractEventV0(topics=topics, data=data)),
            )
        )


# --- strict argument decoding (what the SDK's TryFromVal does in a real contract) -------------------


def expect_args(args: list[xdr.SCVal], n: int, fn: str) -> None:
    if len(args) != n:
        raise StorageTrap("WasmVm, InvalidAction", f"{fn}: expected {n} arguments, got {len(args)}")


def as_address(v: xdr.SCVal) -> bytes:
    """An Address argument as SCAddress XDR bytes (account or contract only)."""
    if v.type != _SCV.SCV_ADDRESS or v.address is None or v.address.type not in (0, 1):
        raise ValueTrap(f"expected Address, got {v.type.name}")
    return enc_scaddress(v.address)


def as_i128(v: xdr.SCVal) -> int:
    if v.type != _SCV.SCV_I128 or v.i128 is None:
        raise ValueTrap(f"expected i128, got {v.type.name}")
    return (v.i128.hi.int64 << 64) | v.i128.lo.uint64


def as_u32(v: xdr.SCVal) -> int:
    if v.type != _SCV.SCV_U32 or v.u32 is None:
        raise ValueTrap(f"expected u32, got {v.type.name}")
    return v.u32.uint32


def as_bool(v: xdr.SCVal) -> bool:
    if v.type != _SCV.SCV_BOOL or v.b is None:
        raise ValueTrap(f"expected bool, got {v.type.name}")
    return bool(v.b)


def as_bytesn(v: xdr.SCVal, n: int) -> bytes:
    if v.type != _SCV.SCV_BYTES or v.bytes is None:
        raise ValueTrap(f"expected BytesN<{n}>, got {v.type.name}")
    b = v.bytes.sc_bytes
    if len(b) != n:
        raise ValueTrap(f"expected BytesN<{n}>, got {len(b)} bytes", code="Value, UnexpectedSize")
    return b


def as_vec(v: xdr.SCVal) -> list[xdr.SCVal]:
    if v.type != _SCV.SCV_VEC or v.vec is None:
        raise ValueTrap(f"expected Vec, got {v.type.name}")
    return v.vec.sc_vec


def as_symbol(v: xdr.SCVal) -> bytes:
    if v.type != _SCV.SCV_SYMBOL or v.sym is None:
        raise ValueTrap(f"expected Symbol, got {v.type.name}")
    return v.sym.sc_symbol


def missing_function(fn: bytes) -> StorageTrap:
    return StorageTrap("WasmVm, MissingValue", f"trying to invoke non-existent contract function {fn!r}")


def addr_str(b: bytes) -> str:
    """SCAddress XDR bytes -> G…/C… strkey (slow: CRC16 in Python; only for state files and messages)."""
    from stellar_sdk import StrKey

    if b[:4] == b"\x00\x00\x00\x01":
        return StrKey.encode_contract(b[4:])
    return StrKey.encode_ed25519_public_key(b[8:])


def addr_bytes(s: str) -> bytes:
    """G…/C… strkey -> SCAddress XDR bytes."""
    from stellar_sdk import StrKey

    from ..storage import ADDR_ACCOUNT, ADDR_CONTRACT

    if s.startswith("C"):
        return ADDR_CONTRACT + StrKey.decode_contract(s)
    if s.startswith("M"):
        return ADDR_ACCOUNT + StrKey.decode_med25519_public_key(s)[:32]
    return ADDR_ACCOUNT + StrKey.decode_ed25519_public_key(s)


def fake_wasm(name: str) -> bytes:
    """A minimal valid wasm module (magic, version, one custom section carrying `name`).

    Gives the modelled contracts real CONTRACT_CODE bytes and a wasm-hash executable, like a
    deployed contract, without pretending to contain code.
    """
    n = name.encode()
    assert len(n) < 127
    body = bytes([len(n)]) + n
    return b"\x00asm\x01\x00\x00\x00" + b"\x00" + bytes([len(body)]) + body
