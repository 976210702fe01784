"""Malformed, truncated and contradictory RPC answers are "unknown", never proof.

The RPC provider here is a tiny loopback server the test controls (tests/hostile/rpc_server.py): it
plays a misbehaving provider outside paygate. Each example starts from answers that WOULD prove
something about a lineage (applied by receipt, superseded by a consumed sequence, expired by a
ledger close time past maxTime), corrupts exactly one thing (a missing field, a wrong type, an
unknown status, a truncated or non-JSON body, XDR that does not decode, an answer about another
transaction or another account, ledgers that contradict each other, a status its result contradicts)
and asserts the endpoint's verdict is "unknown". The uncorrupted answers are checked to prove what
they claim, so the harness itself can fail. Then resolve() and `paygate nonce-inspect` run on a real
database against the same answers: the lineage stays live, nothing is recorded as proof, no exit 70."""

from __future__ import annotations

import base64
import copy
import json
import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from stellar_sdk import Keypair, StrKey, xdr

from paygate_cli.chain.rpc import ChainClient
from paygate_cli.errors import ExitCode, Unavailable
from paygate_cli.journal import lineage as lineages
from paygate_cli.journal.keyring import Keyring
from paygate_cli.journal.lineage import Lineage
from paygate_cli.journal.resolve import decide, judge, resolve
from paygate_cli.settings import load_settings
from tests.hostile.rpc_server import Document, HostileRpc, Raw
from tests.support.cli import base_environ, run_cli

ANSWERS = settings(max_examples=60, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

LANE = Keypair.from_raw_ed25519_seed(bytes([11]) * 32)
STRANGER = Keypair.from_raw_ed25519_seed(bytes([12]) * 32)
SEQ, SIGNED_AT_LEDGER, MAX_TIME = 1000, 100, 5000
INNER_HASH = bytes(range(32)).hex()
OTHER_HASH = bytes(range(1, 33)).hex()
MARKET_CONTRACT = StrKey.encode_contract(bytes([9]) * 32)


def account_entry(owner: Keypair, seq: int) -> str:
    entry = xdr.LedgerEntryData(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.AccountEntry(
        account_id=owner.xdr_account_id(), balance=xdr.Int64(10**9), seq_num=xdr.SequenceNumber(xdr.Int64(seq)),
        num_sub_entries=xdr.Uint32(0), inflation_dest=None, flags=xdr.Uint32(0), home_domain=xdr.String32(b""),
        thresholds=xdr.Thresholds(b"\x01\x00\x00\x00"), signers=[], ext=xdr.AccountEntryExt(0)))
    return entry.to_xdr()


def tx_result(code: xdr.TransactionResultCode, fee: int = 150) -> str:
    return xdr.TransactionResult(fee_charged=xdr.Int64(fee), result=xdr.TransactionResultResult(code=code, results=[]),
                                 ext=xdr.TransactionResultExt(0)).to_xdr()


SUCCESS_XDR = tx_result(xdr.TransactionResultCode.txSUCCESS)
FAILED_XDR = tx_result(xdr.TransactionResultCode.txFAILED)


def entries(owner: Keypair = LANE, seq: int = SEQ, latest: int = 130) -> dict[str, Any]:
    return {"entries": [{"key": "AAAA", "xdr": account_entry(owner, seq), "lastModifiedLedgerSeq": 120}],
            "latestLedger": latest}


def transaction(status: str, **extra: Any) -> dict[str, Any]:
    answer: dict[str, Any] = {"status": status, "txHash": INNER_HASH, "latestLedger": 130,
                              "latestLedgerCloseTime": "4000", "oldestLedger": 10, "oldestLedgerCloseTime": "100"}
    if status != "NOT_FOUND":
        answer.update(ledger=120, resultXdr=SUCCESS_XDR if status == "SUCCESS" else FAILED_XDR, applicationOrder=1,
                      envelopeXdr="AAAA", resultMetaXdr="AAAA", createdAt="3900")
    answer.update(extra)
    return answer


# What each base proves when nothing is corrupted: a receipt, a consumed sequence, a closed maxTime.
BASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "applied": (entries(seq=SEQ), transaction("SUCCESS")),
    "failed": (entries(seq=SEQ), transaction("FAILED")),
    "superseded": (entries(seq=SEQ + 5), transaction("NOT_FOUND")),
    "expired": (entries(seq=SEQ - 1), transaction("NOT_FOUND", latestLedgerCloseTime="6000")),
}

MISSING = object()
WRONG_TYPES = ["abc", [], {}, 1.5, -5, 10**30, None, "", "1e3"]
TX_CORRUPTIONS: dict[str, list[Any]] = {
    "txHash": [OTHER_HASH, MISSING, None, 7, "", INNER_HASH[:-2]],
    "status": ["MAYBE", "", 7, None, "success", "PENDING", MISSING],
    "latestLedger": [*WRONG_TYPES, MISSING],
    "oldestLedger": [*WRONG_TYPES, 131, MISSING],  # 131: past its own latestLedger
    "latestLedgerCloseTime": [*WRONG_TYPES, MISSING],
}
FOUND_CORRUPTIONS: dict[str, list[Any]] = {
    "ledger": [*WRONG_TYPES, 0, 131, 5, MISSING],  # 131: after latestLedger; 5: before oldestLedger
    "resultXdr": ["AAAA", "!!not base64", "", None, MISSING, base64.b64encode(os.urandom(40)).decode()],
}
ENTRY_CORRUPTIONS: list[Any] = [
    {"entries": [{"key": "AAAA", "xdr": account_entry(STRANGER, SEQ + 50), "lastModifiedLedgerSeq": 120}],
     "latestLedger": 130},  # another account's entry (with a sequence that would "prove" superseded)
    {"entries": [{"key": "AAAA", "xdr": "AAAA", "lastModifiedLedgerSeq": 120}], "latestLedger": 130},
    {"entries": [{"key": "AAAA", "xdr": "%%%", "lastModifiedLedgerSeq": 120}], "latestLedger": 130},
    {"entries": [entries()["entries"][0], entries(seq=SEQ + 9)["entries"][0]], "latestLedger": 130},  # two answers
    {"entries": "many", "latestLedger": 130},
    {"entries": [{"xdr": account_entry(LANE, SEQ)}], "latestLedger": 130},
    {"entries": entries()["entries"]},  # latestLedger missing
    {"entries": entries()["entries"], "latestLedger": "soon"},
    {"entries": [{"key": "AAAA", "xdr": account_entry(LANE, -7), "lastModifiedLedgerSeq": 120}], "latestLedger": 130},
]
WHOLE_ANSWER_CORRUPTIONS: list[Any] = [
    Raw(b"<html><body>502 Bad Gateway</body></html>"), Raw(b""), Raw(b"null"), Raw(b"[]"),
    Raw(b'{"jsonrpc": "2.0", "id": 1, "result": {"status": "SUCC'),
    Raw(b'{"jsonrpc": "2.0", "id": 1, "result": {"status": "SUCCESS"}}', truncate=True),
    Raw(b'{"jsonrpc": "2.0", "id": 1, "result": {}}', status=500),
    Document({"jsonrpc": "2.0", "id": 1, "error": "boom"}),
    Document({"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "internal"}}),
    Document({"jsonrpc": "2.0", "id": 1, "result": None}), Document({"jsonrpc": "2.0", "id": 1, "result": [1, 2]}),
    Document({"jsonrpc": "2.0", "id": 1}), Document("SUCCESS"),
]


@st.composite
def corrupted(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A base (what it would prove) and the answers with exactly one thing wrong."""
    base = draw(st.sampled_from(sorted(BASES)))
    entries_answer, tx_answer = copy.deepcopy(BASES[base])
    where = draw(st.sampled_from(["tx", "tx", "found", "contradiction", "entries", "whole"]))
    if where == "found" and tx_answer["status"] == "NOT_FOUND":
        where = "tx"
    answers: dict[str, Any] = {"getLedgerEntries": entries_answer, "getTransaction": tx_answer}
    if where in ("tx", "found"):
        table = TX_CORRUPTIONS if where == "tx" else FOUND_CORRUPTIONS
        field = draw(st.sampled_from(sorted(table)))
        value = draw(st.sampled_from(table[field]))
        if value is MISSING:
            tx_answer.pop(field, None)
        else:
            tx_answer[field] = value
    elif where == "contradiction":  # a status its own result XDR contradicts, or the other way round
        tx_answer.update(draw(st.sampled_from([
            {"status": "SUCCESS", "ledger": 120, "resultXdr": FAILED_XDR},
            {"status": "FAILED", "ledger": 120, "resultXdr": SUCCESS_XDR},
            {"status": "SUCCESS", "ledger": 120, "resultXdr": tx_result(xdr.TransactionResultCode.txSUCCESS, -3)},
        ])))
    elif where == "entries":
        answers["getLedgerEntries"] = draw(st.sampled_from(ENTRY_CORRUPTIONS))
    else:
        answers[draw(st.sampled_from(["getLedgerEntries", "getTransaction"]))] = draw(
            st.sampled_from(WHOLE_ANSWER_CORRUPTIONS))
    return base, answers


def receipt_alone_proves(case: tuple[str, dict[str, Any]]) -> bool:
    """A whole receipt (SUCCESS/FAILED) untouched, only the sequence read corrupted: the receipt by
    itself proves inclusion, so a receipt-first probe rightly takes it (the sequence is only needed
    to judge a NOT_FOUND)."""
    base, answers = case
    return base in ("applied", "failed") and answers["getTransaction"] == BASES[base][1]


def a_lineage(lineage_id: int = 1, state: str = "sent") -> Lineage:
    return Lineage(id=lineage_id, purpose="deposit", entitlement="deposit:1:deposit", lane=LANE.public_key,
                   state=state, source_seq=SEQ, key_id="k", envelope=b"", inner_hash=bytes.fromhex(INNER_HASH),
                   outer_hash=bytes(32), max_time=MAX_TIME, signed_at_ledger=SIGNED_AT_LEDGER, ledger=None,
                   fee_charged=None, result_code=None, resolution=None)


@pytest.fixture
def rpc() -> Iterator[HostileRpc]:
    server = HostileRpc()
    yield server
    server.close()


def chain_for(url: str) -> ChainClient:
    return ChainClient(load_settings({"PAYGATE_RPC_URL": url, "PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT": "1",
                                      "PAYGATE_RPC_TIMEOUT": "2s"}))


def test_uncorrupted_answers_prove_what_they_claim(rpc: HostileRpc) -> None:
    """The harness is honest: the same answers, whole, are proof (so "unknown" below is earned)."""
    chain = chain_for(rpc.url)
    for base, (entries_answer, tx_answer) in BASES.items():
        rpc.answers.update(getLedgerEntries=entries_answer, getTransaction=tx_answer)
        probes = chain.probe(LANE.public_key, INNER_HASH)
        assert [judge(p, a_lineage()) for p in probes] == [base], (base, probes)
    # Upper-case hex is the same hash: not a contradiction.
    rpc.answers.update(getLedgerEntries=entries(), getTransaction=transaction("SUCCESS", txHash=INNER_HASH.upper()))
    assert [judge(p, a_lineage()) for p in chain.probe(LANE.public_key, INNER_HASH)] == ["applied"]
    chain.close()


def test_malformed_or_contradictory_answers_are_unknown_never_proof(rpc: HostileRpc) -> None:
    chain = chain_for(rpc.url)

    @ANSWERS
    @given(case=corrupted())
    def corpus(case: tuple[str, dict[str, Any]]) -> None:
        base, answers = case
        rpc.answers.clear()
        rpc.answers.update(answers)
        probes = chain.probe(LANE.public_key, INNER_HASH)  # never raises: a bad endpoint is a Probe with an error
        verdicts = [judge(p, a_lineage()) for p in probes]
        assert verdicts == ["unknown"], (base, json.dumps(answers, default=repr)[:800], probes)
        assert decide(verdicts) == "wait"
        # The receipt-first probe (what resolve uses) validates the receipt the same way.
        first = [judge(p, a_lineage()) for p in chain.probe(LANE.public_key, INNER_HASH, receipt_first=True)]
        assert first == ([base] if receipt_alone_proves(case) else ["unknown"]), (base, answers, first)

    corpus()
    chain.close()


SEND_ANSWERS: list[Any] = [
    {"status": "ERROR", "hash": INNER_HASH, "latestLedger": 130, "latestLedgerCloseTime": "4000",
     "errorResultXdr": "AAAA"},  # an ERROR whose reason does not decode
    {"status": "ERROR", "hash": INNER_HASH, "latestLedger": 130, "latestLedgerCloseTime": "4000"},  # no reason
    {"status": "MAYBE", "hash": INNER_HASH, "latestLedger": 130, "latestLedgerCloseTime": "4000"},
    Raw(b"<html>"), Document({"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "busy"}}),
]


@pytest.fixture
def signed_lineage(db: psycopg.Connection) -> tuple[Keyring, Lineage]:
    """A real journaled lineage (signed: envelope encrypted and anchored) on a lane of ours."""
    keyring = Keyring({"k": os.urandom(32)}, "k")
    lineages.sync_lanes(db, [LANE.public_key])
    lineage_id, lane = lineages.allocate(db, purpose="deposit", entitlement="deposit:1:deposit",
                                         lanes=[LANE.public_key]) or (0, "")
    key_id, blob = keyring.encrypt(b"AAAAAgAAAAA=", lineage_id=lineage_id, source=lane, seq=SEQ)
    assert lineages.anchor(db, lineage_id, seq=SEQ, key_id=key_id, envelope=blob,
                           inner_hash=bytes.fromhex(INNER_HASH), outer_hash=bytes(32), max_time=MAX_TIME,
                           signed_at_ledger=SIGNED_AT_LEDGER, max_ledger=None)
    return keyring, lineages.load(db, lineage_id)


def test_resolve_keeps_the_lineage_live_on_hostile_answers(rpc: HostileRpc, db: psycopg.Connection,
                                                          signed_lineage: tuple[Keyring, Lineage]) -> None:
    keyring, lineage = signed_lineage
    chain = chain_for(rpc.url)

    @settings(max_examples=30, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(case=corrupted(), send=st.sampled_from(SEND_ANSWERS))
    def corpus(case: tuple[str, dict[str, Any]], send: Any) -> None:
        assume(not receipt_alone_proves(case))  # proof, rightly taken: the test above covers it
        rpc.answers.clear()
        rpc.answers.update(case[1], sendTransaction=send)
        try:
            outcome = resolve(db, chain, keyring, lineages.load(db, lineage.id))
        except Unavailable:
            pass  # no endpoint gave a usable answer: the caller hands its work back
        else:
            assert outcome.state == "sent" and outcome.resent == "UNKNOWN", outcome  # resent the same bytes
        row = db.execute("SELECT state, ledger, resolution, fee_charged FROM paygate.lineages WHERE id = %s",
                         (lineage.id,)).fetchone()
        assert row[0] in ("signed", "sent") and row[1:] == (None, None, None), row

    corpus()
    chain.close()


@pytest.mark.parametrize("case", range(6))
def test_nonce_inspect_on_hostile_answers_never_exits_70(rpc: HostileRpc, dsn: str,
                                                         signed_lineage: tuple[Keyring, Lineage], case: int) -> None:
    answers = [
        {"getTransaction": transaction("SUCCESS", txHash=OTHER_HASH)},
        {"getTransaction": transaction("SUCCESS", resultXdr="AAAA")},
        {"getLedgerEntries": ENTRY_CORRUPTIONS[0]},
        {"getLedgerEntries": ENTRY_CORRUPTIONS[1]},
        {"getTransaction": Raw(b'{"jsonrpc": "2.0", "id": 1, "result": {"sta', truncate=True)},
        {"getLatestLedger": {"id": "x", "protocolVersion": "new", "sequence": -1}},
    ][case]
    # The base proves nothing (sequence not consumed, maxTime not passed): only a corruption could.
    rpc.answers.update(getLedgerEntries=entries(seq=SEQ - 1), getTransaction=transaction("NOT_FOUND"),
                       getLatestLedger={"id": "x", "protocolVersion": 22, "sequence": 130})
    rpc.answers.update(answers)
    environ = base_environ(dsn, PAYGATE_RPC_URL=rpc.url, PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT="1",
                           PAYGATE_RPC_TIMEOUT="2s")
    result = run_cli("nonce-inspect", "--json", environ=environ)
    assert result.code not in (ExitCode.SOFTWARE,), result.err
    assert "Traceback" not in result.err + result.out
    assert result.code in (ExitCode.OK, ExitCode.NEEDS_HUMAN, ExitCode.UNAVAILABLE), result.err
    if result.code == ExitCode.OK:
        assert '"applied"' not in result.out and '"superseded"' not in result.out, result.out


# -- the observer's getEvents pages ---------------------------------------------------------------------

CURSOR = f"{(120 << 32):019d}-0000000000"
GOOD_PAGE = {"events": [], "cursor": CURSOR, "latestLedger": 130, "oldestLedger": 10,
             "latestLedgerCloseTime": "4000", "oldestLedgerCloseTime": "100"}
BAD_PAGES: list[Any] = [
    {**GOOD_PAGE, "cursor": "not-a-cursor"},  # the observer could not even store it
    {**GOOD_PAGE, "cursor": f"{(1 << 32):019d}-0000000000"},  # before the observer's own position
    {k: v for k, v in GOOD_PAGE.items() if k != "latestLedger"}, {**GOOD_PAGE, "oldestLedger": 131},
    {**GOOD_PAGE, "events": "many"}, {**GOOD_PAGE, "events": [{"ledger": 120}]},
    {**GOOD_PAGE, "events": [{"id": "x", "ledger": 9999}]},  # an event from after the page's latest ledger
    Raw(b'{"jsonrpc": "2.0", "id": 1, "result": {"events": [', truncate=True),
    Document({"jsonrpc": "2.0", "id": 1, "error": "boom"}),
]


def test_observer_treats_a_malformed_events_page_as_no_answer(rpc: HostileRpc, dsn: str, db: psycopg.Connection
                                                              ) -> None:
    """The cursor never moves on a page that does not hold together, and the tick is 'unavailable'
    (69: the next tick asks again), never a bug (70)."""
    start = f"{(100 << 32):019d}-0000000000"  # inside the provider's window (10..130)
    db.execute("INSERT INTO paygate.observer_cursor (cursor, ledger) VALUES (%s, 100)", (start,))
    rpc.answers.update(getHealth={"status": "healthy", "latestLedger": 130, "oldestLedger": 10,
                                  "ledgerRetentionWindow": 120},
                       getLatestLedger={"id": "x", "protocolVersion": 22, "sequence": 130})
    environ = base_environ(dsn, PAYGATE_RPC_URL=rpc.url, PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT="1",
                           PAYGATE_RPC_TIMEOUT="2s", PAYGATE_BILLING_CONTRACT=MARKET_CONTRACT)
    for bad in BAD_PAGES:
        rpc.answers["getEvents"] = bad
        result = run_cli("run-tick", "observer", "--once", "--json", environ=environ)
        assert result.code == ExitCode.UNAVAILABLE, (bad, result.code, result.err[-800:])
        assert "Traceback" not in result.err + result.out
        assert db.execute("SELECT cursor FROM paygate.observer_cursor").fetchone()[0] == start, bad
        assert db.execute("SELECT count(*) FROM paygate.chain_events").fetchone()[0] == 0, bad
    # The same tick with a well-formed page moves the cursor: the failures above were the pages' doing.
    rpc.answers["getEvents"] = GOOD_PAGE
    assert run_cli("run-tick", "observer", "--once", "--json", environ=environ).code == ExitCode.OK
    assert db.execute("SELECT cursor FROM paygate.observer_cursor").fetchone()[0] == CURSOR


# -- a lane's sequence (chain/accounts.py): the same verdict through urllib (nonce-inspect --lane) and
# through ChainClient's sessions (the workers) ----------------------------------------------------------

LANE_READ_CORRUPTIONS: list[Any] = [
    ENTRY_CORRUPTIONS[0], ENTRY_CORRUPTIONS[1], ENTRY_CORRUPTIONS[2], ENTRY_CORRUPTIONS[-1],  # entry XDR
    {"entries": "many", "latestLedger": 130}, {"entries": entries()["entries"]},  # the answer's shape
    *WHOLE_ANSWER_CORRUPTIONS,
    Document({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "invalid params"}}),
]


def test_lane_sequence_reads_a_good_answer_in_both_carriers(rpc: HostileRpc, dsn: str, db: psycopg.Connection
                                                            ) -> None:
    """The harness is honest: the uncorrupted answer is read, so the refusals below are earned."""
    rpc.answers.update(getLedgerEntries=entries(seq=SEQ))
    lineages.sync_lanes(db, [LANE.public_key])
    environ = base_environ(dsn, PAYGATE_RPC_URL=rpc.url, PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT="1",
                           PAYGATE_RPC_TIMEOUT="2s")
    result = run_cli("nonce-inspect", "--json", "--lane", LANE.public_key, environ=environ)
    assert result.code == ExitCode.OK and json.loads(result.out)["lanes"][0]["chain_seq"] == SEQ, result.err
    chain = chain_for(rpc.url)
    try:
        assert chain.account_sequence(LANE.public_key) == SEQ
    finally:
        chain.close()


@pytest.mark.parametrize("case", range(len(LANE_READ_CORRUPTIONS)))
def test_a_malformed_lane_read_is_unavailable_never_a_bug(rpc: HostileRpc, dsn: str, db: psycopg.Connection,
                                                          case: int) -> None:
    """A lane entry that does not decode, is another account's or has a negative sequence, an answer
    of the wrong shape, a garbled body or a JSON-RPC error: exit 69 (unknown, ask again later), never
    a number read from it, never 70; the workers' ChainClient raises the same class with the same msgid."""
    corruption = LANE_READ_CORRUPTIONS[case]
    rpc.answers.update(getLedgerEntries=corruption)
    lineages.sync_lanes(db, [LANE.public_key])
    environ = base_environ(dsn, PAYGATE_RPC_URL=rpc.url, PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT="1",
                           PAYGATE_RPC_TIMEOUT="2s")
    result = run_cli("nonce-inspect", "--json", "--lane", LANE.public_key, environ=environ)
    assert result.code == ExitCode.UNAVAILABLE, (corruption, result.code, result.err)
    assert "Traceback" not in result.err + result.out and '"chain_seq"' not in result.out
    msgid = json.loads(result.err.strip().splitlines()[-1])["msgid"]
    if case < 4:  # an entry that does not hold together: named as malformed
        assert msgid == "rpc.malformed", result.err
    chain = chain_for(rpc.url)
    try:
        with pytest.raises(Unavailable) as caught:
            chain.account_sequence(LANE.public_key)
    finally:
        chain.close()
    assert caught.value.msgid == msgid
