"""sendTransaction admission and apply-time checks: every error code,
queue statuses, replace-by-fee, bans, and resending an applied envelope."""

from __future__ import annotations

from stellar_sdk import (
    Account,
    Asset,
    Keypair,
    Network,
    SorobanDataBuilder,
    SorobanServer,
    TransactionBuilder,
    scval,
    xdr,
)
from stellar_sdk.soroban_rpc import GetTransactionStatus, SendTransactionStatus

from tests.devnet.helpers import addr, fee_bump, inner_code, invoke_tx, kp, result_code
from tests.support.devnet_support import DevnetHandle

S = SendTransactionStatus


def fresh(devnet: DevnetHandle, xlm: int = 100 * 10_000_000) -> Keypair:
    """A new funded account, so each test owns its sequence numbers."""
    res = devnet.rpc("devnet_createAccount", {"xlm": xlm})
    return Keypair.from_secret(res["secret"])


def payment(server: SorobanServer, devnet: DevnetHandle, src: Keypair, *, seq_offset: int = 0, fee: int = 100,
            timeout: int | None = 300, dest: str | None = None, sign: bool = True,
            passphrase: str | None = None) -> TransactionBuilder:
    acct = server.load_account(src.public_key)
    acct.sequence += seq_offset
    tb = TransactionBuilder(acct, passphrase or devnet.passphrase, base_fee=fee)
    tb.append_payment_op(dest or devnet.genesis["issuer"]["public"], Asset.native(), "1")
    if timeout is not None:
        tb.set_timeout(timeout)
    return tb


def send(server: SorobanServer, env) -> object:
    return server.send_transaction(env)


def signed(tb: TransactionBuilder, *kps: Keypair):
    tx = tb.build()
    for k in kps:
        tx.sign(k)
    return tx


def test_plain_payment_is_pending_then_applied_and_consumes_the_sequence(server, devnet) -> None:
    src = fresh(devnet)
    before = server.load_account(src.public_key).sequence
    tx = signed(payment(server, devnet, src), src)
    sent = send(server, tx)
    assert sent.status == S.PENDING and sent.hash == tx.hash_hex()
    assert sent.error_result_xdr is None
    devnet.close_ledger()
    got = server.get_transaction(tx.hash_hex())
    assert got.status == GetTransactionStatus.SUCCESS and got.fee_bump is False
    assert result_code(got.result_xdr) == "txSUCCESS"
    assert server.load_account(src.public_key).sequence == before + 1


def test_bad_seq_too_high_and_too_low(server, devnet) -> None:
    src = fresh(devnet)
    sent = send(server, signed(payment(server, devnet, src, seq_offset=1), src))
    assert sent.status == S.ERROR and result_code(sent.error_result_xdr) == "txBAD_SEQ"
    sent = send(server, signed(payment(server, devnet, src, seq_offset=-1), src))
    assert sent.status == S.ERROR and result_code(sent.error_result_xdr) == "txBAD_SEQ"


def test_fee_bump_with_bad_inner_seq_reports_inner_failed_with_bad_seq(server, devnet) -> None:
    src = fresh(devnet)
    fb = fee_bump(devnet, signed(payment(server, devnet, src, seq_offset=3), src))
    sent = send(server, fb)
    assert sent.status == S.ERROR
    assert result_code(sent.error_result_xdr) == "txFEE_BUMP_INNER_FAILED"
    assert inner_code(sent.error_result_xdr) == "txBAD_SEQ"
    r = xdr.TransactionResult.from_xdr(sent.error_result_xdr)
    assert r.result.inner_result_pair.transaction_hash.hash == fb.transaction.inner_transaction_envelope.hash()


def test_time_bounds_too_late_and_too_early_against_ledger_close_time(server, devnet) -> None:
    src = fresh(devnet)
    close = int(server.get_latest_ledger().close_time)
    late = payment(server, devnet, src, timeout=None).add_time_bounds(0, close - 1)
    sent = send(server, signed(late, src))
    assert result_code(sent.error_result_xdr) == "txTOO_LATE"
    # maxTime is inclusive: exactly the latest close time is still valid at submission
    edge = payment(server, devnet, src, timeout=None).add_time_bounds(0, close)
    early = signed(payment(server, devnet, src, timeout=None).add_time_bounds(close + 100, 0), src)
    assert result_code(send(server, early).error_result_xdr) == "txTOO_EARLY"
    ok = send(server, signed(edge, src))
    assert ok.status == S.PENDING
    # … but the next ledger closes 5 s later, so it is trimmed at apply: never included, no fee.
    seq_before = server.load_account(src.public_key).sequence
    devnet.close_ledger()
    assert server.get_transaction(ok.hash).status == GetTransactionStatus.NOT_FOUND
    assert server.load_account(src.public_key).sequence == seq_before


def test_ledger_bounds_max_ledger_is_exclusive(server, devnet) -> None:
    src = fresh(devnet)
    latest = server.get_latest_ledger().sequence
    tx = signed(payment(server, devnet, src).set_ledger_bounds(0, latest + 1), src)
    assert result_code(send(server, tx).error_result_xdr) == "txTOO_LATE"
    tx = signed(payment(server, devnet, src).set_ledger_bounds(latest + 5, 0), src)
    assert result_code(send(server, tx).error_result_xdr) == "txTOO_EARLY"
    tx = signed(payment(server, devnet, src).set_ledger_bounds(0, latest + 2), src)
    assert send(server, tx).status == S.PENDING
    devnet.close_ledger()
    assert server.get_transaction(tx.hash_hex()).status == GetTransactionStatus.SUCCESS


def test_insufficient_fee_below_100_per_op(server, devnet) -> None:
    src = fresh(devnet)
    tx = signed(payment(server, devnet, src, fee=99), src)
    sent = send(server, tx)
    assert result_code(sent.error_result_xdr) == "txINSUFFICIENT_FEE"


def test_fee_bump_rate_must_match_the_inner_rate(server, devnet) -> None:
    src = fresh(devnet)
    inner = signed(payment(server, devnet, src, fee=500), src)
    # SDK refuses a lower base fee, so build the outer envelope by hand: fee 600 over 2 ops < 500/op
    fee_kp = kp(devnet.genesis["fee_account"])
    fb = TransactionBuilder.build_fee_bump_transaction(fee_kp.public_key, 500, inner, devnet.passphrase)
    fb.transaction.fee = 600
    fb.signatures = []
    fb.sign(fee_kp)
    assert fb.to_xdr_object().fee_bump.tx.fee.int64 == 600
    sent = send(server, fb)
    assert sent.status == S.ERROR and result_code(sent.error_result_xdr) == "txINSUFFICIENT_FEE"
    # the same rate (500 per op over ops+1) is accepted
    ok = fee_bump(devnet, inner, base_fee=500)
    assert send(server, ok).status == S.PENDING


def test_insufficient_balance_counts_queued_fees(server, devnet) -> None:
    poor = fresh(devnet, xlm=10_000_000 + 3_000)  # the 1 XLM reserve + 3,000 stroops
    a, b = fresh(devnet), fresh(devnet)

    def bump(src: Keypair):
        fb = TransactionBuilder.build_fee_bump_transaction(
            poor.public_key, 1_000, signed(payment(server, devnet, src), src), devnet.passphrase)
        fb.sign(poor)
        return fb

    assert send(server, bump(a)).status == S.PENDING  # bids 2,000 of the 3,000
    sent = send(server, bump(b))  # another 2,000: only 1,000 left once the queued fee is counted
    assert sent.status == S.ERROR and result_code(sent.error_result_xdr) == "txINSUFFICIENT_BALANCE"
    devnet.close_ledger()
    # Applied, the first one was charged the base fee (2 x 100), not its 2,000 bid: room again.
    assert send(server, bump(b)).status == S.PENDING


def test_bad_auth_wrong_network_missing_and_extra_signatures(server, devnet) -> None:
    src, other = fresh(devnet), fresh(devnet)
    wrong_net = signed(payment(server, devnet, src, passphrase=Network.TESTNET_NETWORK_PASSPHRASE), src)
    assert result_code(send(server, wrong_net).error_result_xdr) == "txBAD_AUTH"
    unsigned = signed(payment(server, devnet, src))
    assert result_code(send(server, unsigned).error_result_xdr) == "txBAD_AUTH"
    extra = signed(payment(server, devnet, src), src, other)
    assert result_code(send(server, extra).error_result_xdr) == "txBAD_AUTH_EXTRA"


def test_no_account(server, devnet) -> None:
    ghost = Keypair.random()
    tx = TransactionBuilder(Account(ghost.public_key, 1 << 32), devnet.passphrase, base_fee=100) \
        .append_payment_op(devnet.genesis["issuer"]["public"], Asset.native(), "1").set_timeout(300).build()
    tx.sign(ghost)
    assert result_code(send(server, tx).error_result_xdr) == "txNO_ACCOUNT"


def _soroban_tx(server, devnet, src: Keypair, *, resource_fee: int, instructions: int = 1_000_000,
                extra_op: bool = False, fee: int = 100):
    g = devnet.genesis
    tb = TransactionBuilder(server.load_account(src.public_key), devnet.passphrase, base_fee=fee)
    tb.append_invoke_contract_function_op(g["contracts"]["billing"], "balance", [addr(src.public_key)])
    if extra_op:
        tb.append_bump_sequence_op(0)
    tb.set_timeout(300).set_soroban_data(
        SorobanDataBuilder().set_resource_fee(resource_fee).set_resources(instructions, 1000, 500).build())
    tx = tb.build()
    tx.sign(src)
    return tx


def test_soroban_malformed_and_invalid(server, devnet) -> None:
    src = fresh(devnet)
    two_ops = _soroban_tx(server, devnet, src, resource_fee=500_000, extra_op=True)
    assert result_code(send(server, two_ops).error_result_xdr) == "txMALFORMED"
    over_fee = _soroban_tx(server, devnet, src, resource_fee=500_000)
    over_fee.transaction.fee = 1_000  # resourceFee > fee
    over_fee.signatures = []
    over_fee.sign(src)
    assert result_code(send(server, over_fee).error_result_xdr) == "txMALFORMED"
    too_many_insns = _soroban_tx(server, devnet, src, resource_fee=5_000_000, instructions=100_000_001)
    assert result_code(send(server, too_many_insns).error_result_xdr) == "txSOROBAN_INVALID"
    cheap = _soroban_tx(server, devnet, src, resource_fee=10)
    assert result_code(send(server, cheap).error_result_xdr) == "txSOROBAN_INVALID"
    missing = signed(payment(server, devnet, src), src)
    assert send(server, missing).status == S.PENDING  # the account itself was never the problem


def test_soroban_op_without_soroban_data_is_malformed(server, devnet) -> None:
    src = fresh(devnet)
    tx = invoke_tx(server, devnet, src, devnet.genesis["contracts"]["billing"], "balance",
                   [addr(src.public_key)], prepare=False)
    tx.sign(src)
    assert result_code(send(server, tx).error_result_xdr) == "txMALFORMED"


def test_duplicate_and_try_again_later_for_a_busy_source(server, devnet) -> None:
    src = fresh(devnet)
    tx = signed(payment(server, devnet, src), src)
    assert send(server, tx).status == S.PENDING
    assert send(server, tx).status == S.DUPLICATE
    other = signed(payment(server, devnet, src, fee=200), src)  # same seq, different hash
    assert send(server, other).status == S.TRY_AGAIN_LATER
    nxt = signed(payment(server, devnet, src, seq_offset=1), src)
    assert send(server, nxt).status == S.TRY_AGAIN_LATER
    devnet.close_ledger()
    assert server.get_transaction(tx.hash_hex()).status == GetTransactionStatus.SUCCESS
    assert server.get_transaction(other.hash_hex()).status == GetTransactionStatus.NOT_FOUND


def test_plain_tx_while_its_fee_bump_is_queued_is_duplicate(server, devnet) -> None:
    src = fresh(devnet)
    inner = signed(payment(server, devnet, src), src)
    assert send(server, fee_bump(devnet, inner)).status == S.PENDING
    assert send(server, inner).status == S.DUPLICATE


def test_replace_by_fee_needs_ten_times_the_rate(server, devnet) -> None:
    src = fresh(devnet)
    inner = signed(payment(server, devnet, src), src)
    first = fee_bump(devnet, inner, base_fee=200)
    assert send(server, first).status == S.PENDING
    low = fee_bump(devnet, inner, base_fee=1_999)
    sent = send(server, low)
    assert sent.status == S.ERROR and result_code(sent.error_result_xdr) == "txINSUFFICIENT_FEE"
    assert xdr.TransactionResult.from_xdr(sent.error_result_xdr).fee_charged.int64 == 4_000
    high = fee_bump(devnet, inner, base_fee=2_000)
    assert send(server, high).status == S.PENDING
    devnet.close_ledger()
    assert server.get_transaction(high.hash_hex()).status == GetTransactionStatus.SUCCESS
    assert server.get_transaction(first.hash_hex()).status == GetTransactionStatus.NOT_FOUND
    got = server.get_transaction(inner.hash_hex())  # the inner hash finds the replacement
    assert got.status == GetTransactionStatus.SUCCESS and got.fee_bump is True


def test_resending_an_applied_envelope_never_applies_twice(server, devnet) -> None:
    src = fresh(devnet)
    inner = signed(payment(server, devnet, src), src)
    fb = fee_bump(devnet, inner)
    assert send(server, fb).status == S.PENDING
    devnet.close_ledger()
    balance = devnet.fund(src.public_key)["xlm"]
    for _ in range(9):  # banned for 10 ledgers after it was applied
        assert send(server, fb).status == S.TRY_AGAIN_LATER
        devnet.close_ledger()
    devnet.close_ledger()
    sent = send(server, fb)
    assert sent.status == S.ERROR
    assert result_code(sent.error_result_xdr) == "txFEE_BUMP_INNER_FAILED"
    assert inner_code(sent.error_result_xdr) == "txBAD_SEQ"
    assert result_code(send(server, inner).error_result_xdr) == "txBAD_SEQ"
    assert devnet.fund(src.public_key)["xlm"] == balance
    assert server.get_transaction(fb.hash_hex()).status == GetTransactionStatus.SUCCESS


def test_failed_transaction_consumes_sequence_and_fee(server, devnet) -> None:
    src = fresh(devnet)
    g = devnet.genesis
    tx = invoke_tx(server, devnet, src, g["contracts"]["market"], "buy",
                   [addr(src.public_key), scval.to_symbol("fail"), scval.to_int128(5)], prepare=False)
    # simulation of a trapping call fails, so declare resources by hand
    tx.transaction.soroban_data = SorobanDataBuilder().set_resource_fee(2_000_000) \
        .set_resources(5_000_000, 5_000, 5_000).build()
    tx.transaction.fee += 2_000_000
    tx.sign(src)
    before = server.load_account(src.public_key)
    xlm_before = devnet.fund(src.public_key)["xlm"]
    assert send(server, tx).status == S.PENDING
    devnet.close_ledger()
    got = server.get_transaction(tx.hash_hex())
    assert got.status == GetTransactionStatus.FAILED
    assert result_code(got.result_xdr) == "txFAILED"
    assert server.load_account(src.public_key).sequence == before.sequence + 1
    assert devnet.fund(src.public_key)["xlm"] < xlm_before
    assert got.events.contract_events_xdr == [[]]


def _prepared_buy(server, devnet, src: Keypair):
    """A market buy by `src` for itself (SOURCE_ACCOUNT auth), prepared by simulation, unsigned."""
    g = devnet.genesis
    return invoke_tx(server, devnet, src, g["contracts"]["market"], "buy",
                     [addr(src.public_key), scval.to_symbol("tea"), scval.to_int128(1)])


def _resign(tx, src: Keypair):
    tx.signatures = []
    tx.sign(src)
    return tx


def _op_code(server, h: str) -> str:
    got = server.get_transaction(h)
    assert got.status == GetTransactionStatus.FAILED
    r = xdr.TransactionResult.from_xdr(got.result_xdr)
    return r.result.results[0].tr.invoke_host_function_result.code.name


def test_under_declared_instructions_fail_with_resource_limit_exceeded(server, devnet) -> None:
    src = Keypair.from_secret(devnet.genesis["users"][0]["secret"])
    devnet.fund(src.public_key, usdc=100)
    tx = _prepared_buy(server, devnet, src)
    tx.transaction.soroban_data.resources.instructions = xdr.Uint32(1)
    sent = send(server, _resign(tx, src))
    assert sent.status == S.PENDING  # within limits and paid for: admitted
    devnet.close_ledger()
    assert _op_code(server, tx.hash_hex()) == "INVOKE_HOST_FUNCTION_RESOURCE_LIMIT_EXCEEDED"


def test_footprint_missing_a_written_key_traps(server, devnet) -> None:
    src = Keypair.from_secret(devnet.genesis["users"][1]["secret"])
    tx = _prepared_buy(server, devnet, src)
    fp = tx.transaction.soroban_data.resources.footprint
    assert fp.read_write
    fp.read_write = fp.read_write[1:]
    sent = send(server, _resign(tx, src))
    assert sent.status == S.PENDING
    devnet.close_ledger()
    assert _op_code(server, tx.hash_hex()) == "INVOKE_HOST_FUNCTION_TRAPPED"


def test_fee_bump_outer_failures_are_not_wrapped(server, devnet) -> None:
    src = fresh(devnet)
    inner = signed(payment(server, devnet, src), src)
    ghost = Keypair.random()
    fb = TransactionBuilder.build_fee_bump_transaction(ghost.public_key, 200, inner, devnet.passphrase)
    fb.sign(ghost)
    assert result_code(send(server, fb).error_result_xdr) == "txNO_ACCOUNT"
    fee_kp = kp(devnet.genesis["fee_account"])
    fb = TransactionBuilder.build_fee_bump_transaction(fee_kp.public_key, 200, inner, devnet.passphrase)
    fb.sign(src)  # signed by the wrong key
    assert result_code(send(server, fb).error_result_xdr) == "txBAD_AUTH"


def test_missing_operation(server, devnet) -> None:
    src = fresh(devnet)
    tx = signed(payment(server, devnet, src), src)
    env = tx.to_xdr_object()
    env.v1.tx.operations = []
    env.v1.signatures = []
    from stellar_sdk import TransactionEnvelope

    empty = TransactionEnvelope.from_xdr(env.to_xdr(), devnet.passphrase)
    empty.sign(src)
    assert result_code(send(server, empty).error_result_xdr) == "txMISSING_OPERATION"
