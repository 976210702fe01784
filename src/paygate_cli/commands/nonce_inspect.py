"""`paygate nonce-inspect`: lanes (journal vs chain sequence) and deposit authorisations."""

from __future__ import annotations

from typing import Annotated

import typer

from paygate_cli.commands._common import CHAIN_READ_SECRETS, JsonFlag, PlainFlag, get_env, open_db, output_mode
from paygate_cli.commands.completion import complete_lanes
from paygate_cli.errors import ExitCode
from paygate_cli.output import amount, emit


def nonce_inspect_command(
    ctx: typer.Context,
    lane: Annotated[str | None, typer.Option("--lane", help="One lane (default: every lane).",
                                             autocompletion=complete_lanes)] = None,
    deposit: Annotated[int | None, typer.Option("--deposit", help="A deposit id.")] = None,
    relay: Annotated[int | None, typer.Option("--relay", help="A relay id.")] = None,
    json_flag: JsonFlag = False, plain_flag: PlainFlag = False,
) -> int:
    """Journal vs chain: lane sequences, in-flight lineages and what resolve would do, deposit nonces.
    Read-only. Exit 3 when something needs a human (a sequence gap, a nonce spent elsewhere).

    Example: `paygate nonce-inspect --deposit 42 --json`"""
    from paygate_cli.ops.nonce_inspect import check_request, nonce_inspect

    env = get_env(ctx)
    env.use_only_secrets(*CHAIN_READ_SECRETS)
    mode = output_mode(json_flag, plain_flag)
    check_request(lane=lane, deposit_id=deposit, relay_id=relay)
    with open_db(env, "nonce-inspect") as conn:
        report = nonce_inspect(conn, env.settings, lane=lane, deposit_id=deposit, relay_id=relay)
    if "relay" in report:
        relay_report = report["relay"]
        auth = relay_report["authorisation"]
        rows = [{"lineage": lin["id"], "state": lin["state"], "lane": lin["lane"], "seq": lin["source_seq"],
                 "inner_hash": lin["inner_hash"], "fee_charged": amount(lin["fee_charged"], "XLM"),
                 "would": lin["resolution"]["would"]} for lin in relay_report["lineages"]]
        lines = [f"relay {relay}: {relay_report['relay']['status']}; nonces {auth['nonces']} consumed on chain: "
                 f"{auth['consumed_on_chain'] or 'none'}; expires at ledger {_known(auth['expiration_ledger'])} "
                 f"(latest {_known(auth['latest_ledger'])}); fee {relay_report['fee_reservation']['status']}"]
        emit(env, mode, report, rows=rows, lines=lines)
    elif "deposit" in report:
        deposit_report = report["deposit"]
        auth = deposit_report["authorisation"]
        rows = [{"lineage": lin["id"], "purpose": lin["purpose"], "state": lin["state"], "lane": lin["lane"],
                 "seq": lin["source_seq"], "inner_hash": lin["inner_hash"], "would": lin["resolution"]["would"]}
                for lin in deposit_report["lineages"]]
        lines = [f"deposit {deposit}: {deposit_report['deposit']['status']}; nonce {auth['nonce']} "
                 f"{'consumed' if auth['consumed_on_chain'] else 'not consumed'} on chain; expires at ledger "
                 f"{_known(auth['expiration_ledger'])} (latest {_known(auth['latest_ledger'])})"]
        emit(env, mode, report, rows=rows, lines=lines)
    else:
        rows = [{"lane": r["lane"], "status": r["status"], "chain_seq": r["chain_seq"],
                 "journal_seq": r["journal_last_consumed_seq"],
                 "in_flight": (f"lineage {r['in_flight']['id']} {r['in_flight']['state']} seq "
                               f"{r['in_flight']['source_seq']}: {r['in_flight']['resolution']['would']}"
                               if r["in_flight"] else ""),
                 "finding": r["finding"]} for r in report["lanes"]]
        emit(env, mode, report, rows=rows, lines=[_fence_line(r) for r in report["lanes"] if r["fence"]])
    return ExitCode.NEEDS_HUMAN if report["needs_human"] else ExitCode.OK


def _known(value: object) -> str:
    """A ledger number, or "unknown" when the chain did not say (never Python's None)."""
    return "unknown" if value is None else str(value)


def _fence_line(lane: dict) -> str:
    """A fenced lane's evidence in one line: the range the chain used outside the journal, where,
    and the transactions found for it."""
    fence, evidence = lane["fence"], lane["fence"]["evidence"] or {}
    where = (f"seqLedger {evidence['seq_ledger']} (seqTime {evidence.get('seq_time')})" if evidence.get("seq_ledger")
             else f"account last modified in ledger {evidence['last_modified_ledger']}"
             if evidence.get("last_modified_ledger") else "ledger unknown")
    txs = evidence.get("transactions")
    found = (", ".join(f"{t['hash']} (seq {t['seq']}, {t['status']})" for t in txs) if txs
             else "none found in that ledger" if txs is not None else "not looked up")
    span = evidence.get("range") or [evidence.get("source_seq"), evidence.get("chain_seq")]
    return (f"lane {lane['lane']} fenced (finding {fence['finding_id']}, seen {fence['seen_count']}x since "
            f"{fence['first_seen']}): sequences {span[0]}..{span[1]}; {where}; transactions: {found}. Resolve with "
            f"SELECT paygate.accept_lane_fence('{lane['lane']}', '<you>') once explained, then undrain.")


def register(app: typer.Typer) -> None:
    app.command("nonce-inspect")(nonce_inspect_command)
