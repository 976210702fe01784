"""Soroban authorization for the devnet host (CAP-46-11, CAP-71).

`AuthContext.require_auth` is what a contract's `address.require_auth()` does in the real host:

* enforce/apply: find an unused `SorobanAuthorizationEntry` for that address whose root invocation
  matches the current call (contract, function, args), then for ADDRESS / ADDRESS_V2 credentials
  check the expiration window, verify the ed25519 signature over the preimage and consume the
  nonce (a TEMPORARY `SCV_LEDGER_KEY_NONCE` entry owned by the address, live until the
  signature's expiration ledger). Any failure traps the whole invocation.
* record: emit the entry the client must sign — SOURCE_ACCOUNT credentials when the address is the
  transaction source, otherwise ADDRESS_V2 (or legacy ADDRESS) with a host-chosen nonce,
  `signatureExpirationLedger` 0 and a void signature — and touch the keys the signed call will
  touch, so the simulated footprint is the one the signed transaction needs.

Model limits (deliberate): a G-account is authorised by its master key alone (weight 1 meets the
default medium threshold 0; extra signers and raised thresholds are not modelled);
C-address credentials (custom account contracts, `__check_auth`) and ADDRESS_WITH_DELEGATES are
rejected; nested calls are not modelled, so sub-invocations in an entry are not checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Literal

from stellar_sdk import Keypair, xdr
from stellar_sdk.auth import authorization_payload_hash, build_authorization_preimage
from stellar_sdk.exceptions import BadSignatureError

from .storage import (
    ADDR_ACCOUNT,
    Staging,
    StorageTrap,
    account_key,
    enc_scaddress,
    nonce_key,
    scaddress_from_bytes,
)

_CT = xdr.SorobanCredentialsType
_SCV = xdr.SCValType

# Instruction estimates (deterministic; real hosts charge ~0.4M for an ed25519 check + preimage).
ADDRESS_AUTH_INSTRUCTIONS = 600_000
SOURCE_AUTH_INSTRUCTIONS = 20_000


class AuthTrap(StorageTrap):
    def __init__(self, detail: str, code: str = "Auth, InvalidAction") -> None:
        super().__init__(code, detail)


def sc_eq(a: xdr.SCVal, b: xdr.SCVal) -> bool:
    """Structural SCVal equality, fast for the shapes contract args use (SDK __eq__ compares 22 fields)."""
    if a is b:
        return True
    t = a.type
    if t != b.type:
        return False
    if t == 16:  # VEC
        if a.vec is None or b.vec is None:
            return a.vec is b.vec
        x, y = a.vec.sc_vec, b.vec.sc_vec
        return len(x) == len(y) and all(map(sc_eq, x, y))
    if t == 18:  # ADDRESS
        return enc_scaddress(a.address) == enc_scaddress(b.address)  # type: ignore[arg-type]
    if t == 10:  # I128
        p, q = a.i128, b.i128
        return p.hi.int64 == q.hi.int64 and p.lo.uint64 == q.lo.uint64  # type: ignore[union-attr]
    if t == 13:
        return a.bytes.sc_bytes == b.bytes.sc_bytes  # type: ignore[union-attr]
    if t == 15:
        return a.sym.sc_symbol == b.sym.sc_symbol  # type: ignore[union-attr]
    return a == b


def invocation_matches(inv: xdr.SorobanAuthorizedInvocation, contract: bytes, fn: bytes, args: list[xdr.SCVal]) -> bool:
    f = inv.function
    if f.type != xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN:
        return False
    ca = f.contract_fn
    assert ca is not None
    if ca.function_name.sc_symbol != fn or enc_scaddress(ca.contract_address) != contract:
        return False
    return len(ca.args) == len(args) and all(map(sc_eq, ca.args, args))


class _Candidate:
    __slots__ = ("address", "creds", "entry", "used")

    def __init__(
        self, entry: xdr.SorobanAuthorizationEntry, address: bytes | None, creds: xdr.SorobanAddressCredentials | None
    ) -> None:
        self.entry = entry
        self.address = address  # None: SOURCE_ACCOUNT credentials
        self.creds = creds
        self.used = False


class AuthContext:
    """Per-invocation auth state: the entries supplied with the transaction, or the recording."""

    def __init__(
        self,
        *,
        network_passphrase: str,
        entries: list[xdr.SorobanAuthorizationEntry],
        source_address: bytes,
        mode: Literal["apply", "record", "enforce"],
        staging: Staging,
        next_nonce: Callable[[], int],
        use_upgraded_auth: bool = True,
        account_exists: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.passphrase = network_passphrase
        self.account_exists = account_exists
        self.source = source_address
        self.mode = mode
        self.staging = staging
        self.next_nonce = next_nonce
        self.upgraded = use_upgraded_auth
        self.recorded: list[xdr.SorobanAuthorizationEntry] = []
        self.instructions = 0
        self.candidates: list[_Candidate] = []
        if mode != "record":
            for e in entries:
                t = e.credentials.type
                if t == _CT.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT:
                    self.candidates.append(_Candidate(e, None, None))
                elif t == _CT.SOROBAN_CREDENTIALS_ADDRESS:
                    c = e.credentials.address
                    assert c is not None
                    self.candidates.append(_Candidate(e, enc_scaddress(c.address), c))
                elif t == _CT.SOROBAN_CREDENTIALS_ADDRESS_V2:
                    c = e.credentials.address_v2
                    assert c is not None
                    self.candidates.append(_Candidate(e, enc_scaddress(c.address), c))
                # ADDRESS_WITH_DELEGATES is not modelled: such an entry never matches, so the
                # require_auth it was meant for fails with Error(Auth, InvalidAction).

    # --- the host's require_auth ------------------------------------------------------------------

    def require_auth(
        self, address: bytes, contract_addr: xdr.SCAddress, contract: bytes, fn: bytes, args: list[xdr.SCVal]
    ) -> None:
        if self.mode == "record":
            self._record(address, contract_addr, fn, args)
            return
        for cand in self.candidates:
            if cand.used:
                continue
            who = self.source if cand.address is None else cand.address
            if who != address or not invocation_matches(cand.entry.root_invocation, contract, fn, args):
                continue
            cand.used = True
            if cand.creds is None:
                self.instructions += SOURCE_AUTH_INSTRUCTIONS
                return
            self.instructions += ADDRESS_AUTH_INSTRUCTIONS
            self._authenticate(cand)
            return
        raise AuthTrap(
            "[failed authorization] no matching authorization entry for address "
            f"{_strkey(address)} calling {fn.decode(errors='replace')}"
        )

    def _authenticate(self, cand: _Candidate) -> None:
        creds = cand.creds
        assert creds is not None and cand.address is not None
        ledger = self.staging.ledger_seq
        exp = creds.signature_expiration_ledger.uint32
        # Valid through exp inclusive; rejected when it lies beyond what a nonce entry could live.
        if exp < ledger:
            raise AuthTrap(f"signature has expired: expiration ledger {exp} < current ledger {ledger}")
        max_lu = ledger + self.staging.ttl.max_entry - 1  # the network's max-entry-ttl
        if exp > max_lu:
            raise AuthTrap(f"signature expiration is too late: {exp} > {max_lu}")
        if cand.address[:8] != ADDR_ACCOUNT:
            raise AuthTrap("contract (custom account) authorization is not modelled by the devnet")
        ed = cand.address[8:]
        # The real host loads the account entry to read its signers and thresholds.
        self.staging.touch_read(account_key(ed))
        if self.account_exists is not None and not self.account_exists(ed):
            raise AuthTrap(f"account {_strkey(cand.address)} does not exist")
        self._consume_nonce(cand.address, creds.nonce.int64, exp)
        self._verify_signature(cand.entry, creds, ed, exp)

    def _consume_nonce(self, address: bytes, nonce: int, exp: int) -> None:
        key = nonce_key(address, nonce)
        if self.staging.get(key) is not None:
            raise AuthTrap("nonce already exists for address", code="Auth, ExistingValue")
        self.staging.put(key, "void", None, live_until=exp)

    def _verify_signature(
        self, entry: xdr.SorobanAuthorizationEntry, creds: xdr.SorobanAddressCredentials, ed25519: bytes, exp: int
    ) -> None:
        sig = creds.signature
        if sig.type != _SCV.SCV_VEC or sig.vec is None or not sig.vec.sc_vec:
            raise AuthTrap("signature is not a non-empty Vec<AccountEd25519Signature>")
        payload = authorization_payload_hash(build_authorization_preimage(entry, exp, self.passphrase))
        prev = b""
        master_signed = False
        for item in sig.vec.sc_vec:
            fields: dict[bytes, xdr.SCVal] = {}
            if item.type == _SCV.SCV_MAP and item.map is not None:
                for me in item.map.sc_map:
                    if me.key.type == _SCV.SCV_SYMBOL:
                        fields[me.key.sym.sc_symbol] = me.val  # type: ignore[union-attr]
            pk_v, sig_v = fields.get(b"public_key"), fields.get(b"signature")
            if (
                len(fields) != 2
                or pk_v is None
                or sig_v is None
                or pk_v.type != _SCV.SCV_BYTES
                or sig_v.type != _SCV.SCV_BYTES
            ):
                raise AuthTrap("malformed account signature: expected Map{public_key, signature}")
            pk, raw = pk_v.bytes.sc_bytes, sig_v.bytes.sc_bytes  # type: ignore[union-attr]
            if len(pk) != 32 or len(raw) != 64:
                raise AuthTrap("malformed account signature: bad key or signature length")
            # Signatures must be sorted by public key without duplicates, as the host demands.
            if pk <= prev:
                raise AuthTrap("account signatures are not sorted by public key")
            prev = pk
            if pk != ed25519:
                raise AuthTrap("signer does not belong to the account (only the master key is modelled)")
            try:
                Keypair.from_raw_ed25519_public_key(pk).verify(payload, raw)
            except BadSignatureError as exc:
                raise AuthTrap("failed account authentication: invalid ed25519 signature") from exc
            master_signed = True
        if not master_signed:
            raise AuthTrap("signature weight below the medium threshold")

    # --- recording --------------------------------------------------------------------------------

    def _record(self, address: bytes, contract_addr: xdr.SCAddress, fn: bytes, args: list[xdr.SCVal]) -> None:
        inv = xdr.SorobanAuthorizedInvocation(
            function=xdr.SorobanAuthorizedFunction(
                xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
                contract_fn=xdr.InvokeContractArgs(contract_addr, xdr.SCSymbol(fn), list(args)),
            ),
            sub_invocations=[],
        )
        if address == self.source:
            self.instructions += SOURCE_AUTH_INSTRUCTIONS
            creds = xdr.SorobanCredentials(_CT.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT)
        else:
            self.instructions += ADDRESS_AUTH_INSTRUCTIONS
            nonce = self.next_nonce()
            ac = xdr.SorobanAddressCredentials(
                address=scaddress_from_bytes(address),
                nonce=xdr.Int64(nonce),
                signature_expiration_ledger=xdr.Uint32(0),
                signature=xdr.SCVal(_SCV.SCV_VOID),
            )
            if self.upgraded:
                creds = xdr.SorobanCredentials(_CT.SOROBAN_CREDENTIALS_ADDRESS_V2, address_v2=ac)
            else:
                creds = xdr.SorobanCredentials(_CT.SOROBAN_CREDENTIALS_ADDRESS, address=ac)
            # The signed transaction will read the account and write this nonce: put both in the footprint.
            if address[:8] == ADDR_ACCOUNT:
                self.staging.touch_read(account_key(address[8:]))
            self.staging.touch_read(nonce_key(address, nonce))
            self.staging.touch_write(nonce_key(address, nonce))
        self.recorded.append(xdr.SorobanAuthorizationEntry(credentials=creds, root_invocation=inv))


def deterministic_nonce(seed: bytes, counter: int) -> int:
    """Host-chosen record-mode nonce: reproducible across runs, distinct per recording."""
    return int.from_bytes(hashlib.sha256(seed + counter.to_bytes(8, "big")).digest()[:8], "big", signed=True)


def _strkey(address: bytes) -> str:
    from stellar_sdk import StrKey

    if address[:8] == ADDR_ACCOUNT:
        return StrKey.encode_ed25519_public_key(address[8:])
    return StrKey.encode_contract(address[4:])
