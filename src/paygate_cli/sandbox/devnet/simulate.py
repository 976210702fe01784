"""simulateTransaction: run the invocation on the host without committing, and answer with the
footprint, resources and resource fee a transaction needs (as simulateTransaction reports them). Failures go in
`error` with HTTP 200, as stellar-rpc does. The result is what `SorobanServer.prepare_transaction`
assembles, so a prepared transaction always passes the devnet's own admission checks.
"""

from __future__ import annotations

from typing import Any

from stellar_sdk import xdr

from paygate_cli.sandbox.devnet import fees
from paygate_cli.sandbox.devnet.ledger import Devnet
from paygate_cli.sandbox.devnet.validate import SOROBAN_OPS, Parsed

# Preflight pads the measured instructions (stellar-rpc preflight: x1.04 + 50,000) so a transaction
# prepared now still fits when state has moved a little by the time it applies.
INSTRUCTIONS_FACTOR = 1.04
INSTRUCTIONS_ADD = 50_000


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
    outcome = dev.host.invoke(
        host_function=call.host_function, auth=list(call.auth), source_account=source, ledger_seq=dev.latest + 1,
        ledger_close_time=dev.latest_info.close_time, mode=mode,  # type: ignore[arg-type]
        use_upgraded_auth=upgraded,
    )
    events = [xdr.DiagnosticEvent(in_successful_contract_call=outcome.ok, event=e).to_xdr()
              for e in outcome.events]
    if not outcome.ok:
        out["error"] = outcome.error or "HostError: Error(WasmVm, InvalidAction)"
        out["events"] = events
        return out
    auth = list(outcome.auth) if mode == "record" else list(call.auth)
    rw_raw = {k.to_xdr_bytes() for k in outcome.read_write}
    read_only = [k for k in outcome.read_only if k.to_xdr_bytes() not in rw_raw]
    instructions = int(outcome.instructions * INSTRUCTIONS_FACTOR) + INSTRUCTIONS_ADD + leeway
    res = fees.Resources(instructions=instructions, disk_read_bytes=outcome.read_bytes,
                         write_bytes=outcome.write_bytes, read_entries=len(read_only),
                         write_entries=len(outcome.read_write))
    data = _soroban_data(read_only, list(outcome.read_write), res, 0)
    size = _priced_size(p, data, auth)
    events_bytes = sum(len(e.to_xdr_bytes()) for e in outcome.events)
    rv = outcome.return_value or xdr.SCVal(xdr.SCValType.SCV_VOID)
    events_bytes += len(rv.to_xdr_bytes())
    resource_fee = fees.non_refundable_fee(res, size) + fees.refundable_fee(events_bytes)
    data.resource_fee = xdr.Int64(resource_fee)
    out.update({
        "transactionData": data.to_xdr(), "minResourceFee": str(resource_fee), "events": events,
        "results": [{"auth": [e.to_xdr() for e in auth], "xdr": rv.to_xdr()}],
    })
    return out


def _soroban_data(read_only: list[xdr.LedgerKey], read_write: list[xdr.LedgerKey], res: fees.Resources,
                  resource_fee: int) -> xdr.SorobanTransactionData:
    return xdr.SorobanTransactionData(
        ext=xdr.SorobanTransactionDataExt(0),
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


def _simulate_footprint_op(dev: Devnet, p: Parsed, out: dict[str, Any]) -> dict[str, Any]:
    """ExtendFootprintTTL / RestoreFootprint: price the footprint the transaction already declares."""
    assert p.soroban is not None  # simulate_input_error demands it
    fp = p.soroban.resources.footprint
    res = fees.Resources(instructions=0, disk_read_bytes=p.soroban.resources.disk_read_bytes.uint32,
                         write_bytes=p.soroban.resources.write_bytes.uint32,
                         read_entries=len(fp.read_only), write_entries=len(fp.read_write))
    data = _soroban_data(list(fp.read_only), list(fp.read_write), res, 0)
    fee = fees.non_refundable_fee(res, _priced_size(p, data, []))
    data.resource_fee = xdr.Int64(fee)
    out.update({"transactionData": data.to_xdr(), "minResourceFee": str(fee), "events": [],
                "results": []})
    return out
