"""Settings precedence and secrets: flags > env > file > defaults; secrets only from files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paygate_cli.errors import ConfigError, SecretMissing
from paygate_cli.secrets import Secret, scrub
from paygate_cli.settings import load_settings, parse_duration
from tests.support.cli import base_environ, run_cli, run_proc

KNOWN_SECRET = "SB7KNOWNSECRETVALUE-do-not-print-4242"


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('statement_timeout = "7s"\nlock_timeout = "3s"\nwebhook_timeout = "9s"\n')
    environ = {"PAYGATE_LOCK_TIMEOUT": "4s", "PAYGATE_WEBHOOK_TIMEOUT": "8s"}
    settings = load_settings(environ, overrides={"webhook_timeout": 1.5}, config_path=str(config))
    assert settings.webhook_timeout == 1.5 and settings.sources["webhook_timeout"] == "flag"
    assert settings.lock_timeout == 4.0 and settings.sources["lock_timeout"] == "env PAYGATE_LOCK_TIMEOUT"
    assert settings.statement_timeout == 7.0 and settings.sources["statement_timeout"].startswith("file ")
    assert settings.idle_in_transaction_timeout == 60.0 and settings.sources["idle_in_transaction_timeout"] == "default"


def test_config_file_discovery_order(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    (xdg / "paygate").mkdir(parents=True)
    (xdg / "paygate" / "config.toml").write_text('instance_id = "from-xdg"\n')
    explicit = tmp_path / "explicit.toml"
    explicit.write_text('instance_id = "from-env-config"\n')
    assert load_settings({"XDG_CONFIG_HOME": str(xdg)}).instance_id == "from-xdg"
    both = {"XDG_CONFIG_HOME": str(xdg), "PAYGATE_CONFIG": str(explicit)}
    assert load_settings(both).instance_id == "from-env-config"


def test_secret_from_file_strips_one_newline(tmp_path: Path) -> None:
    path = tmp_path / "fee"
    path.write_text(KNOWN_SECRET + "\n")
    settings = load_settings({"PAYGATE_FEE_SECRET_FILE": str(path)})
    assert settings.secret("fee_secret").reveal() == KNOWN_SECRET


def test_secret_from_credentials_directory(tmp_path: Path) -> None:
    (tmp_path / "fee-secret").write_text(KNOWN_SECRET)
    settings = load_settings({"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert settings.secret("fee_secret").reveal() == KNOWN_SECRET
    assert settings.sources["fee_secret"].startswith("credential ")


def test_plain_env_secret_is_refused_naming_the_file_variable() -> None:
    with pytest.raises(ConfigError, match="PAYGATE_FEE_SECRET_FILE"):
        load_settings({"PAYGATE_FEE_SECRET": KNOWN_SECRET})


def test_secret_in_toml_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'fee_secret = "{KNOWN_SECRET}"\n')
    with pytest.raises(ConfigError, match="fee_secret_file"):
        load_settings({}, config_path=str(config))


def test_both_plain_and_file_database_url_refused(tmp_path: Path) -> None:
    path = tmp_path / "dsn"
    path.write_text("postgresql:///x")
    with pytest.raises(ConfigError, match="not both"):
        load_settings({"PAYGATE_DATABASE_URL": "postgresql:///y", "PAYGATE_DATABASE_URL_FILE": str(path)})


def test_missing_secret_file_names_variable_and_path() -> None:
    with pytest.raises(SecretMissing, match="PAYGATE_LANE_SECRETS_FILE: secret file /nope/lanes does not exist"):
        load_settings({"PAYGATE_LANE_SECRETS_FILE": "/nope/lanes"})


def test_secret_repr_and_str_never_show_the_value() -> None:
    secret = Secret(KNOWN_SECRET, "/x")
    assert KNOWN_SECRET not in repr(secret) and KNOWN_SECRET not in str(secret)
    assert KNOWN_SECRET not in f"{secret} {secret!r} {[secret]} {({'s': secret})}"
    assert scrub(f"leaked {KNOWN_SECRET} here") == "leaked *** here"


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from([("ms", 0.001), ("s", 1), ("min", 60), ("h", 3600)]))
def test_parse_duration_units(value: int, unit: tuple[str, float]) -> None:
    assert parse_duration(f"{value}{unit[0]}") == pytest.approx(value * unit[1])


def test_config_show_redacts_secrets_and_dsn_password(tmp_path: Path) -> None:
    fee = tmp_path / "fee"
    fee.write_text(KNOWN_SECRET)
    dsn = "postgresql://app:Pa55word-very-secret@db.example:5432/pay"
    result = run_cli("config", "show", "--sources", "--json", PAYGATE_FEE_SECRET_FILE=str(fee),
                     PAYGATE_DATABASE_URL=dsn)
    assert result.code == 0
    document = json.loads(result.out)
    values = {row["name"]: row for row in document["settings"]}
    assert values["fee_secret"]["value"] == "<redacted>"
    assert values["fee_secret"]["source"] == "file via PAYGATE_FEE_SECRET_FILE"
    assert values["database_url"]["value"] == "postgresql://app:***@db.example:5432/pay"
    assert KNOWN_SECRET not in result.out + result.err
    assert "Pa55word-very-secret" not in result.out + result.err


def test_secrets_never_appear_in_any_output_even_on_failure(tmp_path: Path) -> None:
    """A known secret value, loaded from its file, with the database password in the DSN: no stdout,
    stderr, log line or debug traceback of a failing run shows either."""
    fee = tmp_path / "fee"
    fee.write_text(KNOWN_SECRET)
    dsn = f"postgresql://postgres:Pa55word-very-secret@/postgres?host={tmp_path}&port=1"
    for args in (["status"], ["status", "--json"], ["--log-format", "json", "run-tick", "webhooks"],
                 ["config", "show", "--sources"], ["config", "show", "--plain"]):
        for debug in ("", "1"):
            environ = base_environ(dsn, PAYGATE_FEE_SECRET_FILE=str(fee), PAYGATE_DEBUG=debug)
            result = run_proc(*args, environ=environ)
            assert KNOWN_SECRET not in result.out + result.err, args
            assert "Pa55word-very-secret" not in result.out + result.err, args


def test_lane_shares_parse_from_env_and_toml(tmp_path: Path) -> None:
    settings = load_settings({"PAYGATE_LANE_SHARES": "relay=3, funding=2"})
    assert settings.lane_shares == {"relay": 3, "funding": 2}
    config = tmp_path / "paygate.toml"
    config.write_text("[lane_shares]\nsettlement = 2\n")
    assert load_settings({}, config_path=str(config)).lane_shares == {"settlement": 2}
    assert load_settings({}).lane_shares == {}


@pytest.mark.parametrize(("value", "message"), [
    ("observer=2", "not a worker that signs on lanes"),
    ("funding", "not WORKER=COUNT"),
    ("funding=0", "at least one lane"),
    ("funding=two", "not an integer"),
    ("funding=1,funding=2", "named twice"),
])
def test_bad_lane_shares_are_one_clear_config_error(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings({"PAYGATE_LANE_SHARES": value})


def test_lanes_for_partitions_the_lanes_by_name_and_shares_the_rest() -> None:
    from paygate_cli.journal.lineage import lanes_for

    lanes = [f"L{i}" for i in range(8)]
    shares = {"settlement": 2, "funding": 3}
    # Names in order (funding, settlement), lanes in address order; L5-L7 are nobody's own.
    assert lanes_for("funding", reversed(lanes), shares) == ["L0", "L1", "L2", "L5", "L6", "L7"]
    assert lanes_for("settlement", lanes, shares) == ["L3", "L4", "L5", "L6", "L7"]
    assert lanes_for("relay", lanes, shares) == lanes  # not named: every lane
    assert lanes_for("relay", lanes, {}) == lanes
    with pytest.raises(ConfigError, match="reserve 9 lanes but 8"):
        lanes_for("funding", lanes, {"funding": 5, "relay": 4})
