"""RPC endpoint URLs as secrets: PAYGATE_RPC_URL_FILE / PAYGATE_RPC_READ_URLS_FILE (and
$CREDENTIALS_DIRECTORY/rpc-url, rpc-read-urls) are read from files, used for real (status reaches
the devnet through them), shown by host only, and exclusive with the plain variables (78)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from paygate_cli.errors import ExitCode
from tests.support.chain_env import chain_environ
from tests.support.cli import run_proc
from tests.support.devnet_support import DevnetHandle, start_devnet

PATH_KEY = "v1/PATHKEY0123456789abcdef"
QUERY_KEY = "QUERYKEY9876543210fedcba"


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet"), lanes=1, users=1)
    yield handle
    handle.stop()


def keyed(devnet: DevnetHandle) -> str:
    """The devnet's URL as a provider's would look: the key in the path and the query (the devnet
    answers JSON-RPC on any path)."""
    return f"{devnet.url.rstrip('/')}/{PATH_KEY}?apikey={QUERY_KEY}"


def secret_file(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def test_rpc_urls_from_files_are_used_and_shown_by_host_only(devnet: DevnetHandle, dsn: str,
                                                               tmp_path: Path) -> None:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    del environ["PAYGATE_RPC_URL"]
    environ["PAYGATE_RPC_URL_FILE"] = secret_file(tmp_path / "rpc-url", keyed(devnet) + "\n")
    environ["PAYGATE_RPC_READ_URLS_FILE"] = secret_file(tmp_path / "rpc-read-urls",
                                                        f"# the providers\n{keyed(devnet)}\n")

    status = run_proc("status", "--json", environ=environ)
    assert status.code == 0, status.err + status.out
    rpc = json.loads(status.out)["status"]["rpc"]
    assert rpc["endpoints"] and all(e["status"] == "healthy" for e in rpc["endpoints"]), rpc

    shown = run_proc("config", "show", "--sources", "--json", environ=environ)
    assert shown.code == 0, shown.err
    rows = {r["name"]: r for r in json.loads(shown.out)["settings"]}
    host = devnet.url.split("://", 1)[1].rstrip("/")
    assert rows["rpc_url"]["value"] == f"http://{host}/<redacted>"
    assert rows["rpc_url"]["source"] == "file via PAYGATE_RPC_URL_FILE"
    assert rows["rpc_read_urls"]["value"] == f"http://{host}/<redacted>"
    assert rows["rpc_read_urls"]["source"] == "file via PAYGATE_RPC_READ_URLS_FILE"
    human = run_proc("config", "show", "--sources", environ=environ)
    for result in (status, shown, human):
        text = result.out + result.err
        assert "PATHKEY" not in text and QUERY_KEY not in text, text


def test_rpc_urls_from_the_credentials_directory(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    del environ["PAYGATE_RPC_URL"]
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    secret_file(credentials / "rpc-url", keyed(devnet))
    secret_file(credentials / "rpc-read-urls", keyed(devnet))
    environ["CREDENTIALS_DIRECTORY"] = str(credentials)
    shown = run_proc("config", "show", "--sources", "--json", environ=environ)
    assert shown.code == 0, shown.err
    rows = {r["name"]: r for r in json.loads(shown.out)["settings"]}
    assert rows["rpc_url"]["source"] == f"credential {credentials / 'rpc-url'}"
    assert rows["rpc_read_urls"]["source"] == f"credential {credentials / 'rpc-read-urls'}"
    assert "PATHKEY" not in shown.out and QUERY_KEY not in shown.out
    assert run_proc("status", "--json", environ=environ).code == 0


@pytest.mark.parametrize("name", ["RPC_URL", "RPC_READ_URLS"])
def test_plain_and_file_together_exit_78_naming_both(devnet: DevnetHandle, dsn: str, tmp_path: Path,
                                                     name: str) -> None:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    environ[f"PAYGATE_{name}"] = devnet.url
    environ[f"PAYGATE_{name}_FILE"] = secret_file(tmp_path / "url", keyed(devnet))
    result = run_proc("config", "show", environ=environ)
    assert result.code == ExitCode.CONFIG, result.err
    assert f"PAYGATE_{name}" in result.err and f"PAYGATE_{name}_FILE" in result.err
    assert "not both" in result.err
    assert "PATHKEY" not in result.err and QUERY_KEY not in result.err


def test_a_file_that_is_not_one_url_exits_78_without_echoing_it(dsn: str, tmp_path: Path) -> None:
    environ = {"PAYGATE_DATABASE_URL": dsn, "XDG_CONFIG_HOME": "/nonexistent-paygate-test-config",
               "PATH": "/usr/bin:/bin",
               "PAYGATE_RPC_URL_FILE": secret_file(tmp_path / "url", f"ftp://nowhere/{PATH_KEY}\n")}
    result = run_proc("config", "show", environ=environ)
    assert result.code == ExitCode.CONFIG, result.err
    assert "PAYGATE_RPC_URL_FILE" in result.err and "PATHKEY" not in result.err
