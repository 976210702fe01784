"""chain/accounts.py, the SDK-free read of a lane's sequence: its StrKey and XDR against
stellar-sdk's own (on real entries and on mangled ones, byte by byte), and the read itself against a
real devnet over HTTP, through both carriers (urllib for cold commands, ChainClient's sessions)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Keypair, SorobanServer, StrKey, xdr
from stellar_sdk.client.requests_client import RequestsClient

from paygate_cli.chain.accounts import (
    LaneNotVisible,
    MalformedAnswer,
    account_address,
    account_key_xdr,
    account_public_key,
    decode_account_seq,
    lane_sequence,
)
from paygate_cli.chain.rpc import ChainClient
from paygate_cli.db.connect import TransactionOpenAcrossNetworkCall, assert_not_in_transaction
from paygate_cli.errors import ExitCode
from paygate_cli.settings import load_settings
from tests.support.chain_env import chain_environ
from tests.support.devnet_support import DevnetHandle, start_devnet

OWNER = Keypair.from_raw_ed25519_seed(bytes([21]) * 32)
OTHER = Keypair.from_raw_ed25519_seed(bytes([22]) * 32)


def sdk_account_seq(entry_xdr: object, address: str | None) -> int | None:
    """The reference: what ChainClient read with stellar-sdk before (None: refused as malformed)."""
    try:
        data = xdr.LedgerEntryData.from_xdr(entry_xdr)  # type: ignore[arg-type]
        account = data.account
        if data.type != xdr.LedgerEntryType.ACCOUNT or account is None:
            return None
        owner = Keypair.from_raw_ed25519_public_key(account.account_id.account_id.ed25519.uint256).public_key
        seq = int(account.seq_num.sequence_number.int64)
    except Exception:
        return None
    if (address is not None and owner != address) or seq < 0:
        return None
    return seq


def fast_account_seq(entry_xdr: object, address: str | None) -> int | None:
    try:
        return decode_account_seq(entry_xdr, address)
    except MalformedAnswer:
        return None


def account_entry(seq: int = 4_294_967_301, *, rich: bool = False, ext: int = 0) -> str:
    """An AccountEntry; `rich`: every optional part filled (inflation destination, home domain,
    a signer of each kind, a signed payload whose length needs padding); `ext`: 0 or the deepest
    extension present (1, 2, 3)."""
    signers = []
    if rich:
        signers = [
            xdr.Signer(xdr.SignerKey(xdr.SignerKeyType.SIGNER_KEY_TYPE_ED25519, ed25519=xdr.Uint256(bytes([1]) * 32)),
                       xdr.Uint32(1)),
            xdr.Signer(xdr.SignerKey(xdr.SignerKeyType.SIGNER_KEY_TYPE_PRE_AUTH_TX,
                                     pre_auth_tx=xdr.Uint256(bytes([2]) * 32)), xdr.Uint32(2)),
            xdr.Signer(xdr.SignerKey(xdr.SignerKeyType.SIGNER_KEY_TYPE_HASH_X, hash_x=xdr.Uint256(bytes([3]) * 32)),
                       xdr.Uint32(3)),
            xdr.Signer(xdr.SignerKey(xdr.SignerKeyType.SIGNER_KEY_TYPE_ED25519_SIGNED_PAYLOAD,
                                     ed25519_signed_payload=xdr.SignerKeyEd25519SignedPayload(
                                         xdr.Uint256(bytes([4]) * 32), b"\x05\x06\x07\x08\x09")), xdr.Uint32(4)),
        ]
    entry_ext = xdr.AccountEntryExt(0)
    if ext:
        v2_ext = xdr.AccountEntryExtensionV2Ext(0)
        if ext >= 3:
            v2_ext = xdr.AccountEntryExtensionV2Ext(3, v3=xdr.AccountEntryExtensionV3(
                ext=xdr.ExtensionPoint(0), seq_ledger=xdr.Uint32(77),
                seq_time=xdr.TimePoint(xdr.Uint64(1_700_000_000))))
        v1_ext = xdr.AccountEntryExtensionV1Ext(0)
        if ext >= 2:
            v1_ext = xdr.AccountEntryExtensionV1Ext(2, v2=xdr.AccountEntryExtensionV2(
                num_sponsored=xdr.Uint32(1), num_sponsoring=xdr.Uint32(2),
                signer_sponsoring_i_ds=[xdr.SponsorshipDescriptor(None),
                                        xdr.SponsorshipDescriptor(OTHER.xdr_account_id())][:len(signers) or 2],
                ext=v2_ext))
        entry_ext = xdr.AccountEntryExt(1, v1=xdr.AccountEntryExtensionV1(
            liabilities=xdr.Liabilities(xdr.Int64(5), xdr.Int64(6)), ext=v1_ext))
    entry = xdr.LedgerEntryData(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.AccountEntry(
        account_id=OWNER.xdr_account_id(), balance=xdr.Int64(10**9), seq_num=xdr.SequenceNumber(xdr.Int64(seq)),
        num_sub_entries=xdr.Uint32(len(signers)), inflation_dest=OTHER.xdr_account_id() if rich else None,
        flags=xdr.Uint32(0), home_domain=xdr.String32(b"pay.example" if rich else b""),
        thresholds=xdr.Thresholds(b"\x01\x00\x00\x00"), signers=signers, ext=entry_ext))
    return entry.to_xdr()


ENTRIES = {f"{'rich' if rich else 'plain'}-ext{ext}": account_entry(rich=rich, ext=ext)
           for rich in (False, True) for ext in (0, 1, 2, 3)}


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_the_decoder_reads_real_entries_as_the_sdk_does(name: str) -> None:
    entry = ENTRIES[name]
    assert fast_account_seq(entry, OWNER.public_key) == sdk_account_seq(entry, OWNER.public_key) == 4_294_967_301
    assert fast_account_seq(entry, None) == 4_294_967_301
    with pytest.raises(MalformedAnswer, match=f"is the account {OWNER.public_key}, not {OTHER.public_key}"):
        decode_account_seq(entry, OTHER.public_key)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_the_decoder_refuses_exactly_what_the_sdk_refuses(name: str) -> None:
    """Every truncation, every byte flipped four ways, trailing bytes: the SDK-free decoder accepts a
    mangled entry exactly when stellar-sdk does, and reads the same sequence from it."""
    raw = base64.b64decode(ENTRIES[name])
    mangled = [raw[:n] for n in range(len(raw))] + [raw + b"\0" * 4, raw + b"\x01"]
    for i in range(len(raw)):
        for flip in (0x01, 0x20, 0x80, 0xFF):  # low, mid and high bits: lengths past a bound, signs, tags
            mangled.append(raw[:i] + bytes([raw[i] ^ flip]) + raw[i + 1:])
    accepted = 0
    for blob in mangled:
        entry = base64.b64encode(blob).decode()
        for address in (OWNER.public_key, None):
            expected = sdk_account_seq(entry, address)
            assert fast_account_seq(entry, address) == expected, (blob.hex(), address)
            accepted += expected is not None
    assert 0 < accepted < 2 * len(mangled)  # the corpus exercises both verdicts


def _spliced(offset: int, old: int, new: bytes) -> str:
    """A plain entry with `old` bytes at `offset` replaced by `new` (shapes the SDK cannot build)."""
    raw = base64.b64decode(account_entry())
    return base64.b64encode(raw[:offset] + new + raw[offset + old:]).decode()


# Offsets in a plain entry: type 4, account ID 36, balance 8, seq 8, numSubEntries 4 -> inflationDest flag
# at 60, flags at 64, homeDomain's length at 68.
@pytest.mark.parametrize("entry, accepted", [
    (_spliced(68, 4, (36).to_bytes(4, "big") + b"x" * 36), False),  # a homeDomain past string32's bound
    (_spliced(68, 4, (32).to_bytes(4, "big") + b"x" * 32), True),  # at the bound
    (_spliced(68, 4, (3).to_bytes(4, "big") + b"abc\x07"), True),  # non-zero padding: not checked by the SDK
    (_spliced(60, 4, (2).to_bytes(4, "big") + bytes(36)), True),  # an optional's flag 2 reads as "present"
    (_spliced(60, 4, (1).to_bytes(4, "big") + (1).to_bytes(4, "big") + bytes(32)), False),  # unknown key type
])
def test_bounds_and_leniencies_are_the_sdks(entry: str, accepted: bool) -> None:
    expected = sdk_account_seq(entry, OWNER.public_key)
    assert (expected is not None) is accepted  # the case is what it says it is
    assert fast_account_seq(entry, OWNER.public_key) == expected


@pytest.mark.parametrize("entry", [None, 5, b"AAAA", "", "AAAA", "%%%", "not base64!", "AAAAAQ==",
                                   account_entry(-7), account_entry(2**63 - 1)])
def test_odd_inputs_get_the_same_verdict(entry: object) -> None:
    assert fast_account_seq(entry, OWNER.public_key) == sdk_account_seq(entry, OWNER.public_key)


def test_a_trustline_entry_is_named_not_an_account() -> None:
    trustline = base64.b64encode((1).to_bytes(4, "big") + base64.b64decode(account_entry())).decode()
    with pytest.raises(MalformedAnswer, match="TRUSTLINE, not an account"):
        decode_account_seq(trustline)


def test_strkey_and_ledger_key_match_the_sdk() -> None:
    for seed in range(20):
        pair = Keypair.from_raw_ed25519_seed(bytes([seed]) * 32)
        key = xdr.LedgerKey(type=xdr.LedgerEntryType.ACCOUNT,
                            account=xdr.LedgerKeyAccount(account_id=pair.xdr_account_id()))
        assert account_key_xdr(pair.public_key) == key.to_xdr()
        assert account_public_key(pair.public_key) == pair.raw_public_key()
        assert account_address(pair.raw_public_key()) == pair.public_key
    good = OWNER.public_key
    broken = good[:-1] + ("A" if good[-1] != "A" else "B")  # checksum no longer matches
    for address in [broken, good.lower(), good[:-2], good + "A", OWNER.secret,
                    StrKey.encode_contract(bytes(32)), "G" + "é" * 55, ""]:
        with pytest.raises(ValueError):
            account_key_xdr(address)
        with pytest.raises(ValueError):
            Keypair.from_public_key(address)


# -- against a real devnet over HTTP ---------------------------------------------------------------------

@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=1)
    yield handle
    handle.stop()


def no_guard(what: str) -> None:
    pass


def test_the_sdk_free_read_agrees_with_the_sdk_and_the_chain_client(devnet: DevnetHandle, dsn: str,
                                                                    tmp_path: Path) -> None:
    settings = load_settings(chain_environ(devnet, dsn, tmp_path / "keys"))
    client = ChainClient(settings)
    server = SorobanServer(devnet.url, client=RequestsClient(num_retries=0))
    try:
        for lane in [pair["public"] for pair in devnet.genesis["lanes"]]:
            answer = devnet.rpc("getLedgerEntries", {"keys": [account_key_xdr(lane)]})
            [entry] = answer["entries"]
            on_chain = server.load_account(lane).sequence
            assert decode_account_seq(entry["xdr"], lane) == sdk_account_seq(entry["xdr"], lane) == on_chain
            assert lane_sequence(settings, lane, no_guard) == client.account_sequence(lane) == on_chain
            devnet.rpc("devnet_consumeSequence", {"account": lane})  # the chain moves: the reads follow
            devnet.close_ledger()
            assert lane_sequence(settings, lane, no_guard) == client.account_sequence(lane) == on_chain + 1
    finally:
        client.close()
        server.close()


def test_an_account_one_node_cannot_see_is_not_visible_yet(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    """A single endpoint cannot prove an account missing (it cannot tell that it lags): both carriers
    say "not visible yet" (69), never "missing" (78)."""
    settings = load_settings(chain_environ(devnet, dsn, tmp_path / "keys"))
    ghost = Keypair.random().public_key
    client = ChainClient(settings)
    try:
        for read in (lambda: lane_sequence(settings, ghost, no_guard), lambda: client.account_sequence(ghost)):
            with pytest.raises(LaneNotVisible, match="not visible on chain yet") as caught:
                read()
            assert caught.value.exit_code == ExitCode.UNAVAILABLE
    finally:
        client.close()


def test_the_sdk_free_read_refuses_to_run_inside_a_transaction(devnet: DevnetHandle, dsn: str, tmp_path: Path
                                                               ) -> None:
    settings = load_settings(chain_environ(devnet, dsn, tmp_path / "keys"))
    lane = devnet.genesis["lanes"][0]["public"]
    with psycopg.connect(dsn) as conn:  # not autocommit: the first statement opens a transaction
        def guard(what: str) -> None:
            assert_not_in_transaction(conn, what)

        conn.execute("SELECT 1")
        with pytest.raises(TransactionOpenAcrossNetworkCall, match="getLedgerEntries"):
            lane_sequence(settings, lane, guard)
        conn.rollback()
        assert lane_sequence(settings, lane, guard) >= 0


def test_many_accounts_read_at_once_are_each_as_one_read_sees_it(devnet: DevnetHandle, dsn: str,
                                                                 tmp_path: Path) -> None:
    """many_lane_views (one getLedgerEntries per read host for every lane: the restore gate) matches
    each answer to its account whatever order the node lists them in, and names an account the node
    does not have "not found", as the one-account read does."""
    from paygate_cli.chain.accounts import many_lane_views

    settings = load_settings(chain_environ(devnet, dsn, tmp_path / "keys"))
    lanes = [pair["public"] for pair in devnet.genesis["lanes"]]
    devnet.rpc("devnet_consumeSequence", {"account": lanes[1]})  # the two lanes' sequences now differ by one
    devnet.close_ledger()
    ghost = Keypair.random().public_key
    client = ChainClient(settings)
    try:
        for asked in ([*lanes, ghost], [ghost, *reversed(lanes)]):
            views = many_lane_views(settings, asked, no_guard)
            assert sorted(views) == sorted(asked)
            for lane in lanes:
                [view] = views[lane]
                [one] = client.account_views(lane)
                assert view.error is None and (view.seq, view.last_modified) == (one.seq, one.last_modified)
                assert view.seq == client.account_sequence(lane)
            [missing] = views[ghost]
            assert missing.error == "not found" and missing.seq is None
    finally:
        client.close()
