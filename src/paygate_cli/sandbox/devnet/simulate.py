"""simulateTransaction: run the invocation on the host without committing, and answer with the
footprint, resources and resource fee a transaction needs (as simulateTransaction reports them). Failures go in
`error` with HTTP 200, as stellar-rpc does. The result is what `SorobanServer.prepare_transaction`
assembles, so a prepared transaction always passes the devnet's own admission checks.

State archival (docs/devnet.md "State archival"): archived entries a call touches are restored by it
(listed in transactionData ext v1, their rent in minResourceFee); when that restore would not fit one
transaction's limits, the answer is the call as if they were restored plus a `restorePreamble`.
"""

from __future__ import annotations

import base64
from typing import Any

from stellar_sdk import xdr

from paygate_cli.sandbox.devnet import fees
from paygate_cli.sandbox.devnet.host import InvokeOutcome
from paygate_cli.sandbox.devnet.ledger import Devnet
from paygate_cli.sandbox.devnet.storage import enc_ledger_key, has_ttl, is_persistent
from paygate_cli.sandbox.devnet.validate import SOROBAN_OPS, Parsed

# Preflight pads the measured instructions (stellar-rpc preflight: x1.04 + 50,000) so a transaction
# prepared now still fits when state has moved a little by the time it applies.
INSTRUCTIONS_FACTOR = 1.04
INSTRUCTIONS_ADD = 50_000
RENT_FACTOR = 1.15  # soroban-simulation's refundable-fee adjustment, applied to rent


AUTH_MODES = ("enforce", "record", "record_allow_nonroot")


def go_op_type(t: xdr.OperationType) -> str:
    """The Go SDK's name of an operation type (OperationType.String()), which stellar-rpc prints."""
    return "OperationType" + "".join(w.capitalize() for w in t.name.split("_"))


def simulate_input_error(p: Parsed, auth_mode: str) -> str | None:
    """The request checks stellar-rpc makes before preflight, in its order and with its texts
    (cmd/stellar-rpc/internal/methods/simulate_transaction.go: the handler, then validateAuthMode)."""
    tx = p.tx
    if len(tx.operations) != 1:
        return "Transaction contains more than one operation"  # also said for zero operations
    if tx.memo.type != xdr.MemoType.MEMO_NONE:
        return "Transaction contains a memo. Soroban transactions do not support memos."
    if auth_mode not in ("", *AUTH_MODES):
        return "optional 'authMode' must be one of " + ",".join(AUTH_MODES) + " when included"
    op = tx.operations[0]
    t = op.body.type
    if t == xdr.OperationType.INVOKE_HOST_FUNCTION:
        call = op.body.invoke_host_function_op
        if auth_mode.startswith("record") and call is not None and call.auth:
            return f"cannot set authMode to '{auth_mode}' with an auth footprint"
        return None
    if t in SOROBAN_OPS:
        if auth_mode:
            return "cannot set authMode with non-InvokeHostFunction operations"
        if p.soroban is None:
            return ("To perform a SimulateTransaction for ExtendFootprintTtl or RestoreFootprint operations,"
                    " SorobanTransactionData must be provided")
        return None
    return f"transaction contains unsupported operation type: {go_op_type(t)}"


def simulate(dev: Devnet, p: Parsed, auth_mode: str | None, upgraded: bool, leeway: int) -> dict[str, Any]:
    """Run a request that passed `simulate_input_error`."""
    out: dict[str, Any] = {"latestLedger": dev.latest}
    tx = p.tx
    op = tx.operations[0]
    source = p.op_source(op)
    if source not in dev.accounts:
        out["error"] = f"Account not found: {source}"
        return out
    if op.body.type != xdr.OperationType.INVOKE_HOST_FUNCTION:
        return _simulate_footprint_op(dev, p, out)
    call = op.body.invoke_host_function_op
    assert call is not None
    if auth_mode is None:
        auth_mode = "enforce" if call.auth else "record"
    mode = "enforce" if auth_mode == "enforce" else "record"

    def run(restore: str) -> InvokeOutcome:
        return dev.host.invoke(
            host_function=call.host_function, auth=list(call.auth), source_account=source,
            ledger_seq=dev.latest + 1, ledger_close_time=dev.latest_info.close_time,
            mode=mode, use_upgraded_auth=upgraded, restore=restore)  # type: ignore[arg-type]

    # Protocol 23: archived entries the call touches are restored inside it (transactionData ext v1).
    outcome = run("auto")
    priced = _price_invoke(p, outcome, mode, call, leeway) if outcome.ok else None
    preamble: dict[str, str] | None = None
    if priced is not None and outcome.restored and priced[2]:
        # The restore does not fit one transaction's limits: answer the invocation as if its entries
        # were restored already, and the RestoreFootprint to send first (restorePreamble).
        as_live = run("as_live")
        if as_live.ok:
            outcome, priced = as_live, _price_invoke(p, as_live, mode, call, leeway)
            preamble = _restore_preamble(dev, p, as_live.preamble)
    events = [xdr.DiagnosticEvent(in_successful_contract_call=outcome.ok, event=e).to_xdr()
              for e in outcome.events]
    if not outcome.ok or priced is None:
        out["error"] = outcome.error or "HostError: Error(WasmVm, InvalidAction)"
        out["events"] = events
        return out
    data, auth, _ = priced
    rv = outcome.return_value or xdr.SCVal(xdr.SCValType.SCV_VOID)
    out.update({
        "transactionData": data.to_xdr(), "minResourceFee": str(data.resource_fee.int64), "events": events,
        "results": [{"auth": [e.to_xdr() for e in auth], "xdr": rv.to_xdr()}],
    })
    if preamble is not None:
        out["restorePreamble"] = preamble
    return out


def _price_invoke(p: Parsed, outcome: InvokeOutcome, mode: str, call: xdr.InvokeHostFunctionOp, leeway: int
                  ) -> tuple[xdr.SorobanTransactionData, list[xdr.SorobanAuthorizationEntry], bool]:
    """(transactionData with its resource fee, the auth entries, whether it exceeds the network limits)."""
    auth = list(outcome.auth) if mode == "record" else list(call.auth)
    rw_raw = {k.to_xdr_bytes() for k in outcome.read_write}
    read_only = [k for k in outcome.read_only if k.to_xdr_bytes() not in rw_raw]
    instructions = int(outcome.instructions * INSTRUCTIONS_FACTOR) + INSTRUCTIONS_ADD + leeway
    res = fees.Resources(instructions=instructions, disk_read_bytes=outcome.read_bytes,
                         write_bytes=outcome.write_bytes, read_entries=len(read_only),
                         write_entries=len(outcome.read_write))
    data = _soroban_data(read_only, list(outcome.read_write), res, 0, outcome.restored)
    size = _priced_size(p, data, auth)
    events_bytes = sum(len(e.to_xdr_bytes()) for e in outcome.events)
    rv = outcome.return_value or xdr.SCVal(xdr.SCValType.SCV_VOID)
    events_bytes += len(rv.to_xdr_bytes())
    resource_fee = (fees.non_refundable_fee(res, size) + fees.refundable_fee(events_bytes)
                    + _padded_rent(outcome.rent_fee))
    data.resource_fee = xdr.Int64(resource_fee)
    return data, auth, fees.limits_violation(res, size) is not None


def _padded_rent(rent: int) -> int:
    """Rent as preflight prices it: padded (soroban-simulation pads the refundable fee by 15%), so a
    transaction that lands a few ledgers later still covers what it owes then; the unused part is
    refunded."""
    return max(rent, int(rent * RENT_FACTOR)) if rent > 0 else 0


def _soroban_data(read_only: list[xdr.LedgerKey], read_write: list[xdr.LedgerKey], res: fees.Resources,
                  resource_fee: int, restored: list[int] | None = None) -> xdr.SorobanTransactionData:
    ext = (xdr.SorobanTransactionDataExt(1, resource_ext=xdr.SorobanResourcesExtV0(
        archived_soroban_entries=[xdr.Uint32(i) for i in restored])) if restored
        else xdr.SorobanTransactionDataExt(0))
    return xdr.SorobanTransactionData(
        ext=ext,
        resources=xdr.SorobanResources(
            footprint=xdr.LedgerFootprint(read_only=read_only, read_write=read_write),
            instructions=xdr.Uint32(res.instructions), disk_read_bytes=xdr.Uint32(res.disk_read_bytes),
            write_bytes=xdr.Uint32(res.write_bytes)),
        resource_fee=xdr.Int64(resource_fee),
    )


def _priced_size(p: Parsed, data: xdr.SorobanTransactionData, auth: list[xdr.SorobanAuthorizationEntry]) -> int:
    """The transaction size to price: the envelope with this sorobanData and signed auth, estimated."""
    old = len(p.soroban.to_xdr_bytes()) if p.soroban is not None else 0
    n_addr = sum(1 for e in auth
                 if e.credentials.type != xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT)
    call = p.tx.operations[0].body.invoke_host_function_op
    old_auth = sum(len(e.to_xdr_bytes()) for e in call.auth) if call is not None else 0
    new_auth = sum(len(e.to_xdr_bytes()) for e in auth)
    return (p.inner_size - old + len(data.to_xdr_bytes()) - old_auth + new_auth
            + fees.SIM_SIZE_MARGIN + fees.SIM_SIZE_PER_AUTH_ENTRY * n_addr)


def _restore_data(dev: Devnet, keys: list[xdr.LedgerKey], p: Parsed) -> xdr.SorobanTransactionData | str:
    """What a RestoreFootprint of `keys` needs (soroban-simulation simulate_restore_op): the archived
    ones, sorted, in the read-write footprint, read and written once each, plus their rent."""
    for k in keys:
        if not is_persistent(enc_ledger_key(k)):
            return (f"Can't restore a ledger entry with key: {k.to_xdr()}. Only persistent ledger entries "
                    "with TTL can be restored.")
    res_out = dev.host.restore_footprint(keys, dev.latest + 1)
    if res_out.missing:
        return f"Missing entry to restore for key {base64.b64encode(res_out.missing[0]).decode()}"
    restored = sorted(res_out.keys)
    rw = [xdr.LedgerKey.from_xdr_bytes(k) for k in restored]
    res = fees.Resources(instructions=0, disk_read_bytes=res_out.entry_bytes, write_bytes=res_out.entry_bytes,
                         read_entries=0, write_entries=len(rw))
    data = _soroban_data([], rw, res, 0)
    fee = fees.non_refundable_fee(res, _footprint_tx_size(p, data)) + _padded_rent(res_out.rent_fee)
    data.resource_fee = xdr.Int64(fee)
    return data


def _restore_preamble(dev: Devnet, p: Parsed, keys: list[xdr.LedgerKey]) -> dict[str, str] | None:
    data = _restore_data(dev, keys, p)
    if isinstance(data, str):
        return None
    return {"transactionData": data.to_xdr(), "minResourceFee": str(data.resource_fee.int64)}


def _footprint_tx_size(p: Parsed, data: xdr.SorobanTransactionData) -> int:
    old = len(p.soroban.to_xdr_bytes()) if p.soroban is not None else 0
    return p.inner_size - old + len(data.to_xdr_bytes()) + fees.SIM_SIZE_MARGIN


def _simulate_footprint_op(dev: Devnet, p: Parsed, out: dict[str, Any]) -> dict[str, Any]:
    """ExtendFootprintTTL / RestoreFootprint (stellar-rpc preflight_footprint_ttl_op): the footprint the
    transaction declares, narrowed to the entries the operation will change, and their rent.
    Extending an archived entry counts it as restored now and answers the restore as restorePreamble."""
    assert p.soroban is not None  # simulate_input_error demands it
    fp = p.soroban.resources.footprint
    op = p.tx.operations[0]
    if op.body.type == xdr.OperationType.RESTORE_FOOTPRINT:
        data = _restore_data(dev, list(fp.read_write), p)
        if isinstance(data, str):
            out["error"] = data
            return out
        out.update({"transactionData": data.to_xdr(), "minResourceFee": str(data.resource_fee.int64),
                    "events": [], "results": []})
        return out
    assert op.body.extend_footprint_ttl_op is not None
    for k in fp.read_only:
        if not has_ttl(enc_ledger_key(k)):
            out["error"] = (f"Can't extend TTL for ledger entry with key `{k.to_xdr()}`. Only entries with TTL "
                            "(contract data or code entries) can have it extended")
            return out
    ext = dev.host.extend_footprint(list(fp.read_only), op.body.extend_footprint_ttl_op.extend_to.uint32,
                                    dev.latest + 1, as_live=True)
    ro = [xdr.LedgerKey.from_xdr_bytes(k) for k in sorted(ext.keys)]
    res = fees.Resources(instructions=0, disk_read_bytes=0, write_bytes=0, read_entries=len(ro), write_entries=0)
    data = _soroban_data(ro, [], res, 0)
    fee = fees.non_refundable_fee(res, _footprint_tx_size(p, data)) + _padded_rent(ext.rent_fee)
    data.resource_fee = xdr.Int64(fee)
    out.update({"transactionData": data.to_xdr(), "minResourceFee": str(fee), "events": [], "results": []})
    if ext.archived:
        preamble = _restore_preamble(dev, p, [xdr.LedgerKey.from_xdr_bytes(k) for k in ext.archived])
        if preamble is not None:
            out["restorePreamble"] = preamble
    return out
