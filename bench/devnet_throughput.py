"""Devnet throughput: fee-bumped `charge_batch` transactions validated and applied per second.

A manual-mode devnet with K lanes; every lane sends R fee-bumped `charge_batch` transactions (one per
ledger, as Stellar queues one per source), all built, simulated and signed before timing. Timed:
sending every envelope over HTTP (a few client threads) and closing the ledgers that apply them.
Baseline, measured in the same run: the unavoidable floor per transaction, decoding the envelope
with `TransactionEnvelope.from_xdr` and one ed25519 verify per signature. Prints figures; asserts nothing.

    .venv/bin/python bench/devnet_throughput.py [--lanes 16] [--rounds 10] [--batch 10] [--threads 2]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nacl.signing import VerifyKey
from stellar_sdk import (
    FeeBumpTransactionEnvelope,
    Keypair,
    SorobanServer,
    TransactionBuilder,
    scval,
    xdr,
)

from tests.support.devnet_support import start_devnet


def build(server: SorobanServer, dev, lanes: list[Keypair], rounds: int, batch: int) -> list[list[str]]:
    g = dev.genesis
    billing = g["contracts"]["billing"]
    fee = Keypair.from_secret(g["fee_account"]["secret"])
    users = [u["public"] for u in g["users"]]
    out: list[list[str]] = []
    accounts = {lane.public_key: server.load_account(lane.public_key) for lane in lanes}
    n = 0
    for r in range(rounds):
        row = []
        for lane in lanes:
            ids = []
            for _ in range(batch):
                n += 1
                ids.append(scval.to_bytes(n.to_bytes(32, "big")))
            args = [scval.to_address(lane.public_key),
                    scval.to_vec([scval.to_address(users[(n + i) % len(users)]) for i in range(batch)]),
                    scval.to_vec([scval.to_int128(1) for _ in range(batch)]), scval.to_vec(ids)]
            acct = accounts[lane.public_key]
            tx = (TransactionBuilder(acct, dev.passphrase, base_fee=100)
                  .append_invoke_contract_function_op(billing, "charge_batch", args).set_timeout(3600).build())
            tx = server.prepare_transaction(tx)
            tx.sign(lane)
            fb = TransactionBuilder.build_fee_bump_transaction(fee.public_key, 200, tx, dev.passphrase)
            fb.sign(fee)
            row.append(fb.to_xdr())
        out.append(row)
        del r
    return out


def baseline(envelopes: list[str], passphrase: str) -> float:
    """Per-second floor: `xdr.TransactionEnvelope.from_xdr` plus one ed25519 verify per signature
    (outer by the fee source, inner by the lane). Hashes and keys are prepared outside the timing."""
    prepared = []
    for b64 in envelopes:
        env = FeeBumpTransactionEnvelope.from_xdr(b64, passphrase)
        inner = env.transaction.inner_transaction_envelope
        prepared.append((b64, [
            (VerifyKey(Keypair.from_public_key(env.transaction.fee_source.account_id).raw_public_key()), env.hash(),
             env.signatures[0].signature),
            (VerifyKey(Keypair.from_public_key(inner.transaction.source.account_id).raw_public_key()),
             inner.hash(), inner.signatures[0].signature)]))
    t0 = time.perf_counter()
    for b64, checks in prepared:
        xdr.TransactionEnvelope.from_xdr(b64)
        for vk, h, sig in checks:
            vk.verify(h, sig)
    return len(envelopes) / (time.perf_counter() - t0)


def credit_users(server: SorobanServer, dev, lane: Keypair) -> None:
    """Give every sample user a billing balance so the timed charges settle (not timed)."""
    g = dev.genesis
    fee = Keypair.from_secret(g["fee_account"]["secret"])
    for i, u in enumerate(g["users"]):
        args = [scval.to_address(lane.public_key), scval.to_address(u["public"]), scval.to_int128(10**12),
                scval.to_bytes(hashlib.sha256(f"bench-deposit-{i}".encode()).digest())]
        tx = (TransactionBuilder(server.load_account(lane.public_key), dev.passphrase, base_fee=100)
              .append_invoke_contract_function_op(g["contracts"]["billing"], "credit", args)
              .set_timeout(3600).build())
        tx = server.prepare_transaction(tx)
        tx.sign(lane)
        fb = TransactionBuilder.build_fee_bump_transaction(fee.public_key, 200, tx, dev.passphrase)
        fb.sign(fee)
        server.send_transaction(fb)
        dev.close_ledger()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dev = start_devnet(tmp, seed="bench", lanes=a.lanes, users=8)
        try:
            with SorobanServer(dev.url) as server:
                g = dev.genesis
                lanes = [Keypair.from_secret(x["secret"]) for x in g["lanes"]]
                credit_users(server, dev, lanes[0])
                t0 = time.perf_counter()
                rows = build(server, dev, lanes, a.rounds, a.batch)
                print(f"built {a.lanes * a.rounds} fee-bumped charge_batch txs (batch {a.batch}) "
                      f"in {time.perf_counter() - t0:.1f}s (not timed)")
                host, port = dev.url.removeprefix("http://").split(":")
                conns = [http.client.HTTPConnection(host, int(port), timeout=60) for _ in range(a.threads)]
                statuses: dict[str, int] = {}
                lock = threading.Lock()

                def send_part(conn: http.client.HTTPConnection, part: list[str]) -> None:
                    for b64 in part:
                        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "sendTransaction",
                                           "params": {"transaction": b64}})
                        conn.request("POST", "/", body, {"Content-Type": "application/json"})
                        st = json.loads(conn.getresponse().read())["result"]["status"]
                        with lock:
                            statuses[st] = statuses.get(st, 0) + 1

                applied = settled = 0
                send_s = close_s = 0.0
                t_start = time.perf_counter()
                for row in rows:
                    t1 = time.perf_counter()
                    threads = [threading.Thread(target=send_part, args=(conns[i], row[i::a.threads]))
                               for i in range(a.threads)]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                    t2 = time.perf_counter()
                    res = dev.close_ledger()
                    applied += sum(1 for x in res["applied"] if x["status"] == "SUCCESS")
                    settled += len(res["applied"])
                    close_s += time.perf_counter() - t2
                    send_s += t2 - t1
                total = time.perf_counter() - t_start
                n = a.lanes * a.rounds
                rate = applied / total
                base = baseline([b for row in rows for b in row], dev.passphrase)
                print(f"send statuses: {statuses}; included {settled}/{n}, SUCCESS {applied}")
                print(f"validated+applied: {rate:.0f} tx/s  (send {send_s:.2f}s, close/apply {close_s:.2f}s, "
                      f"total {total:.2f}s)")
                print(f"baseline decode+verify floor: {base:.0f} tx/s  ratio devnet/baseline: {rate / base:.3f}")
        finally:
            dev.stop()


if __name__ == "__main__":
    main()
