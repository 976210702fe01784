"""`--state FILE`: the devnet's whole state as one JSON document, written atomically
(temp file + fsync + rename) so a crash mid-write leaves the previous state intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stellar_sdk import xdr

from paygate_cli.sandbox.devnet.host import ContractHost
from paygate_cli.sandbox.devnet.ledger import Account, Devnet, EventRecord, LedgerInfo, Queued, TxRecord
from paygate_cli.sandbox.devnet.validate import parse_envelope

FORMAT = 1


def snapshot(dev: Devnet) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "passphrase": dev.passphrase,
        "retention": dev.retention,
        "latest": dev.latest,
        "ledgers": [[i.seq, i.header.to_xdr()] for i in dev.ledgers.headers()],
        "ledger_runs": dev.ledgers.runs_json(),  # ledgers devnet_advance closed: hashes, not headers
        "accounts": {g: [a.balance, a.seq, a.last_modified, a.num_sub_entries, a.thresholds.hex()]
                     for g, a in dev.accounts.items()},
        "queue": [[q.p.b64, q.added_ledger, q.hold_until, q.never] for q in dev.queue],
        "bans": {h.hex(): until for h, until in dev.bans.items()},
        "txs": [asdict(r) for seq in sorted(dev.txs_by_ledger) for r in dev.txs_by_ledger[seq]],
        "events": [asdict(e) for seq in sorted(dev.events_by_ledger) for e in dev.events_by_ledger[seq]],
        "pending_consume": dev.pending_consume,
        "secrets": dev.secrets,
        "genesis": dev.genesis,
        "host": dev.host.snapshot(),
    }


def restore(data: dict[str, Any]) -> Devnet:
    if data.get("format") != FORMAT:
        raise ValueError(f"unsupported state format {data.get('format')!r}")
    passphrase = data["passphrase"]
    dev = Devnet(passphrase, ContractHost.restore(passphrase, data["host"]), retention=data["retention"])
    for seq, header_b64 in data["ledgers"]:
        header = xdr.LedgerHeader.from_xdr(header_b64)
        dev.ledgers[seq] = LedgerInfo(seq, header.scp_value.close_time.time_point.uint64,
                                      hashlib.sha256(header.to_xdr_bytes()).digest(), header)
    dev.ledgers.load_runs(data.get("ledger_runs", []))
    dev.latest = data["latest"]
    dev.first_ledger = min(dev.ledgers)
    for g, (bal, seq, lm, subs, thr) in data["accounts"].items():
        acct = Account(bal, seq, lm, subs, bytes.fromhex(thr))
        dev.accounts[g] = acct
        dev.account_history[g] = [(lm, acct.copy())]
    dev.queue = [Queued(parse_envelope(b64, dev.net_id), added, hold, never)
                 for b64, added, hold, never in data["queue"]]
    dev.bans = {bytes.fromhex(h): until for h, until in data["bans"].items()}
    for d in data["txs"]:
        r = TxRecord(**d)
        dev.txs_by_ledger.setdefault(r.ledger, []).append(r)
        dev.txs[r.full_hash] = r
        dev.txs[r.inner_hash] = r
    for d in data["events"]:
        e = EventRecord(**d)
        dev.events_by_ledger.setdefault(e.ledger, []).append(e)
    dev.pending_consume = list(data["pending_consume"])
    dev.secrets = dict(data["secrets"])
    dev.genesis = dict(data["genesis"])
    return dev


def save(dev: Devnet, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".devnet-state-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(snapshot(dev), f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> Devnet:
    with path.open() as f:
        return restore(json.load(f))
