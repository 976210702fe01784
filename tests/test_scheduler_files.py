"""The scheduler definitions (systemd, cron, Kubernetes, the image) cover all fourteen catalogue
workers at their cadences, give each worker exactly the secrets it needs, parse as run-tick
command lines (a renamed flag breaks CI), and pass the real validators: `systemd-analyze verify`
and `security`, and the Kubernetes OpenAPI schemas (kubernetes-validate)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer._click.exceptions import UsageError as ClickUsageError  # typer vendors click

from paygate_cli.app import app
from paygate_cli.catalogue import RESERVED_WORKER_IDS, WORKERS
from paygate_cli.errors import ConfigError
from paygate_cli.settings import (
    FIELDS,
    MIN_READ_HOSTS,
    MONEY_MOVERS,
    Settings,
    check_read_quorum,
    distinct_read_urls,
    load_settings,
    rpc_host,
)

ROOT = Path(__file__).resolve().parent.parent
SYSTEMD = ROOT / "jobs" / "systemd"
K8S = ROOT / "jobs" / "k8s"
ALL_WORKERS = sorted(RESERVED_WORKER_IDS)

# docs/architecture.md §3 catalogue cadences (seconds) for workers not registered yet; registered ones use the registry.
CATALOGUE_CADENCE = {"funding": 2, "settlement": 2, "subscriptions": 2, "relay": 2, "observer": 2, "recovery": 30,
                     "reconciler": 60, "relay_drainer": 10, "relay_expiry": 60, "gas": 300,
                     "idempotency_sweep": 3600, "webhooks": 1}
# Least privilege: the secrets each worker may see. Signing workers get lanes, fee and journal keys;
# recovery drives a dead owner's lineages (resolve, or resend the journaled bytes it decrypts) and
# never signs: the journal keys, no seed; gas watches the fee account and the lanes by address.
SIGNING = ["database-url", "fee-secret", "journal-keys", "lane-secrets"]
RESENDING = ["database-url", "journal-keys"]
WORKER_SECRETS = {w: ["database-url"] for w in ALL_WORKERS} | {
    "funding": SIGNING, "settlement": SIGNING, "relay": SIGNING, "relay_drainer": SIGNING, "ttl": SIGNING,
    "recovery": RESENDING}
SECRET_ENV = {"database-url": "PAYGATE_DATABASE_URL_FILE", "fee-secret": "PAYGATE_FEE_SECRET_FILE",
              "lane-secrets": "PAYGATE_LANE_SECRETS_FILE", "journal-keys": "PAYGATE_JOURNAL_KEYS_FILE"}


def cadence(worker: str) -> float:
    return WORKERS[worker].cadence if worker in WORKERS else CATALOGUE_CADENCE[worker]


def parse_duration(text: str) -> float:
    units = {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    match = re.fullmatch(r"([\d.]+)\s*([a-z]*)", text)
    assert match, text
    return float(match.group(1)) * units[match.group(2) or "s"]


def parse_run_tick(args: list[str]) -> dict[str, Any]:
    """Parse a command line exactly as `paygate` would, without running it: click raises UsageError on
    an unknown flag, a missing value or an extra argument."""
    group = typer.main.get_command(app)
    root_ctx = group.make_context("paygate", ["run-tick", "x"], resilient_parsing=True)
    command = group.get_command(root_ctx, args[0])  # type: ignore[attr-defined]
    assert command is not None, args
    ctx = command.make_context(args[0], list(args[1:]), parent=root_ctx)
    return dict(ctx.params)


# --- systemd ------------------------------------------------------------------------------------

def read_unit(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) in file order; systemd units repeat keys, so no dict."""
    entries, section = [], ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.append((section, key.strip(), value.strip()))
    return entries


def unit_values(path: Path, key: str) -> list[str]:
    return [v for _, k, v in read_unit(path) if k == key]


def systemd_environment(unit: Path) -> dict[str, str]:
    """Environment= as systemd reads it: the value is split into shell-like words, each VAR=VALUE."""
    environment = {}
    for value in unit_values(unit, "Environment"):
        for word in shlex.split(value):
            name, sep, val = word.partition("=")
            if sep:  # systemd ignores (with a warning) a word that is not an assignment
                environment[name] = val
    return environment


def env_file_args(worker: str) -> str:
    text = (SYSTEMD / f"tick-{worker}.env").read_text()
    match = re.search(r"^PAYGATE_TICK_ARGS=(.*)$", text, re.M)
    assert match, worker
    return match.group(1)


def systemd_command(worker: str, environment: dict[str, str]) -> list[str]:
    """ExecStart after systemd's expansion: %i is the instance, an unbraced $VAR splits into words."""
    [exec_start] = unit_values(SYSTEMD / "paygate-tick@.service", "ExecStart")
    words: list[str] = []
    for word in shlex.split(exec_start.replace("%i", worker)):
        if word.startswith("$") and not word.startswith("${"):
            words += environment.get(word[1:], "").split()
        else:
            words.append(word)
    assert Path(words[0]).name == "paygate"
    return words[1:]


def systemd_commands() -> list[list[str]]:
    template_env = systemd_environment(SYSTEMD / "paygate-tick@.service")
    return [systemd_command(w, {**template_env, "PAYGATE_TICK_ARGS": env_file_args(w)})
            for w in ALL_WORKERS if (SYSTEMD / f"tick-{w}.env").exists()]


def timer_gap(worker: str) -> float:
    """OnUnitInactiveSec= after the template and the worker's drop-ins: an empty assignment resets."""
    values: list[str] = []
    for path in [SYSTEMD / "paygate-tick@.timer", *sorted((SYSTEMD / f"paygate-tick@{worker}.timer.d").glob("*.conf"))]:
        for value in unit_values(path, "OnUnitInactiveSec"):
            values = [] if value == "" else [*values, value]
    assert len(values) == 1, (worker, values)  # two gaps = the fast one still fires
    return parse_duration(values[0])


def credentials(worker: str) -> list[str]:
    paths = [SYSTEMD / "paygate-tick@.service", *sorted((SYSTEMD / f"paygate-tick@{worker}.service.d").glob("*.conf"))]
    return sorted(v.split(":", 1)[0] for p in paths for v in unit_values(p, "LoadCredential"))


def test_every_worker_has_a_unit_env_file_cronjob_and_crontab_line() -> None:
    assert (SYSTEMD / "paygate-tick@.service").exists() and (SYSTEMD / "paygate-tick@.timer").exists()
    assert sorted(c[1] for c in systemd_commands()) == ALL_WORKERS
    assert sorted(c[1] for c in cron_commands()) == ALL_WORKERS
    assert sorted(c[1] for c in k8s_commands()) == ALL_WORKERS
    assert set(WORKERS) <= set(ALL_WORKERS) and len(ALL_WORKERS) == 14


def test_the_template_alone_runs_a_valid_command_without_its_env_file() -> None:
    """An unquoted Environment= is split by systemd into separate assignments, leaving run-tick
    `--every` with no value: exit 2 on every host that has no /etc/paygate/tick-<worker>.env."""
    environment = systemd_environment(SYSTEMD / "paygate-tick@.service")
    params = parse_run_tick(systemd_command("funding", environment))
    assert params["every"] == "2s" and params["for_"] == "10min"


def test_systemd_cadence_matches_the_catalogue() -> None:
    for worker in ALL_WORKERS:
        params = parse_run_tick(["run-tick", worker, *shlex.split(env_file_args(worker))])
        if params["every"] is not None:
            assert parse_duration(params["every"]) == cadence(worker), worker
            assert timer_gap(worker) <= 1, worker
        else:
            assert params["once"], worker
            assert timer_gap(worker) == cadence(worker), worker


def test_each_worker_loads_exactly_the_credentials_it_needs() -> None:
    for worker in ALL_WORKERS:
        assert credentials(worker) == WORKER_SECRETS[worker], worker


def test_the_secrets_each_worker_gets_are_the_ones_its_registry_entry_requires() -> None:
    """WORKER_SECRETS is not a second opinion: a worker gets a seed iff run-tick checks it has it."""
    secret_of = {"lane_keys": "lane-secrets", "fee_key": "fee-secret", "journal_keys": "journal-keys"}
    for worker in ALL_WORKERS:
        requires = WORKERS[worker].requires if worker in WORKERS else ()
        needed = sorted({"database-url"} | {secret_of[r] for r in requires if r in secret_of})
        assert WORKER_SECRETS[worker] == needed, worker


def test_unit_essentials() -> None:
    service = SYSTEMD / "paygate-tick@.service"
    assert unit_values(service, "SuccessExitStatus") == ["75"]
    assert unit_values(service, "StartLimitIntervalSec") == ["0"]
    assert unit_values(SYSTEMD / "paygate-tick@.timer", "AccuracySec") == ["100ms"]
    # No secret is ever an environment variable of the unit (`systemctl show` prints those).
    assert not [k for k in systemd_environment(service) if re.search(r"SECRET|KEYS|DATABASE_URL", k)]


@pytest.fixture(scope="module")
def unit_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The units as installed, ExecStart pointing at this venv's paygate (verify rejects a missing binary)."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: .ci/run installs systemd; install it to run these tests")
    directory = tmp_path_factory.mktemp("units")
    shutil.copytree(SYSTEMD, directory, dirs_exist_ok=True)
    paygate = Path(sys.executable).parent / "paygate"
    assert paygate.exists(), paygate
    service = directory / "paygate-tick@.service"
    service.write_text(service.read_text().replace("/opt/paygate/bin/paygate", str(paygate)))
    return directory


def analyze(unit_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The trailing colon keeps systemd's own search path (targets the units refer to).
    environ = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "SYSTEMD_UNIT_PATH": f"{unit_dir}:", "SYSTEMD_LOG_COLOR": "0"}
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, env=environ,
                          cwd=unit_dir, timeout=60)


@pytest.mark.parametrize("worker", ALL_WORKERS)
def test_systemd_analyze_verify_is_clean(unit_dir: Path, worker: str) -> None:
    # verify exits 0 on unknown keys and bad values too, only warning: a clean stderr is the test.
    result = analyze(unit_dir, "verify", f"paygate-tick@{worker}.service", f"paygate-tick@{worker}.timer",
                     "paygate-alert@x.service")
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


def test_systemd_analyze_verify_catches_a_broken_drop_in(unit_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "units"
    shutil.copytree(unit_dir, broken)
    (broken / "paygate-tick@funding.service.d" / "zz.conf").write_text("[Service]\nLoadCredentail=x:/y\n")
    result = analyze(broken, "verify", "paygate-tick@funding.service")
    assert "Unknown key" in result.stderr


def _offline_supported() -> bool:
    if shutil.which("systemd-analyze") is None:
        return False
    return "--offline" in subprocess.run(["systemd-analyze", "--help"], capture_output=True, text=True).stdout


@pytest.mark.parametrize("worker", ["funding", "observer", "gas"])
def test_tick_unit_exposure_is_at_most_3(unit_dir: Path, worker: str) -> None:
    if not _offline_supported():
        pytest.skip("this systemd-analyze has no --offline (systemd < 250): cannot score an unloaded unit")
    result = analyze(unit_dir, "security", "--offline=yes", "--no-pager", f"paygate-tick@{worker}.service")
    match = re.search(r"Overall exposure level for \S+: ([\d.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 3.0, result.stdout


# --- cron ---------------------------------------------------------------------------------------

def cron_entries() -> list[tuple[str, list[str]]]:
    entries = []
    for line in (ROOT / "crontab.example").read_text().splitlines():
        if re.match(r"^[\d*/,-]+\s", line):
            fields = line.split(None, 5)
            words = shlex.split(fields[5].split("2>>")[0])
            entries.append((" ".join(fields[:5]), words[words.index("paygate") + 1:]))
    return entries


def cron_commands() -> list[list[str]]:
    return [command for _, command in cron_entries()]


def test_crontab_cadence_matches_the_catalogue() -> None:
    for schedule, command in cron_entries():
        worker, params = command[1], parse_run_tick(command)
        if cadence(worker) < 60:
            assert schedule == "* * * * *" and parse_duration(params["every"]) == cadence(worker), command
            # The next minute's run starts while this one ticks and waits for the lock: a loop of
            # under a minute would leave a hole every minute, one longer than 60 s + --lock-wait a skip.
            assert 60 < parse_duration(params["for_"]) < 60 + parse_duration(params["lock_wait"]), command
        else:
            assert params["once"], command
            expected = {60: "* * * * *", 300: "*/5 * * * *"}.get(int(cadence(worker)))
            assert expected is None or schedule == expected, command
            if cadence(worker) == 3600:
                assert re.fullmatch(r"\d+ \* \* \* \*", schedule), command


# --- Kubernetes ---------------------------------------------------------------------------------

def k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in sorted(K8S.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def cronjobs() -> dict[str, dict[str, Any]]:
    jobs = {}
    for _, doc in k8s_documents():
        if doc["kind"] == "CronJob":
            container = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
            jobs[container["args"][1]] = doc
    return jobs


def k8s_commands() -> list[list[str]]:
    return [doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
            for doc in cronjobs().values()]


@pytest.mark.parametrize("version", ["1.29.0", "latest"])
def test_every_manifest_passes_the_kubernetes_schema(version: str) -> None:
    import kubernetes_validate

    target = kubernetes_validate.utils.latest_version() if version == "latest" else version
    documents = k8s_documents()
    assert len(documents) >= 12 + 1 + 4  # a CronJob per worker, the ConfigMap, four Secrets
    for path, doc in documents:
        try:
            kubernetes_validate.validate(doc, target, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.name} {doc['kind']}/{doc['metadata']['name']} against {target}: {exc.message}")


def test_the_schema_validator_rejects_a_misspelt_field() -> None:
    import kubernetes_validate

    doc = cronjobs()["funding"]
    broken = yaml.safe_load(yaml.safe_dump(doc))
    broken["spec"]["concurrencyPolicyy"] = broken["spec"].pop("concurrencyPolicy")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.utils.latest_version(), strict=True)


def test_cronjobs_are_hardened_and_treat_75_as_a_skip() -> None:
    for worker, job in cronjobs().items():
        args = parse_run_tick(job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"])
        if args["every"] is not None:  # a loop: the next pod overlaps it and takes over at its --for
            assert job["spec"]["concurrencyPolicy"] == "Allow", worker
            assert 60 < parse_duration(args["for_"]) < 60 + parse_duration(args["lock_wait"]), worker
            assert job["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] > 60 + parse_duration(args["for_"])
        else:
            assert job["spec"]["concurrencyPolicy"] == "Forbid", worker
        job_spec = job["spec"]["jobTemplate"]["spec"]
        rules = job_spec["podFailurePolicy"]["rules"]
        skip = [r for r in rules if r.get("onExitCodes", {}).get("values") == [75]]
        assert skip and skip[0]["action"] in ("Ignore", "Count") and skip[0]["onExitCodes"]["operator"] == "In"
        pod = job_spec["template"]["spec"]
        assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for container in [*pod["containers"], *pod.get("initContainers", [])]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, worker
            assert sc["capabilities"]["drop"] == ["ALL"], worker
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"], worker
        tick = pod["containers"][0]
        assert tick["name"] == "tick" and skip[0]["onExitCodes"]["containerName"] == "tick"
        metrics_dir = parse_run_tick(tick["args"])["metrics_dir"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mount = next(m for m in tick["volumeMounts"] if m["mountPath"] == metrics_dir)
        assert "emptyDir" in volumes[mount["name"]] and not mount.get("readOnly"), worker


def test_each_pod_mounts_only_the_secrets_its_worker_needs() -> None:
    secrets = {doc["metadata"]["name"]: doc for _, doc in k8s_documents() if doc["kind"] == "Secret"}
    for worker, job in cronjobs().items():
        pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        tick = pod["containers"][0]
        mounted = []
        for volume in pod["volumes"]:
            for source in volume.get("projected", {}).get("sources", []):
                mounted += list(secrets[source["secret"]["name"]]["stringData"])
            if "secret" in volume:
                mounted += list(secrets[volume["secret"]["secretName"]]["stringData"])
        assert sorted(mounted) == WORKER_SECRETS[worker], worker
        file_vars = {e["name"] for e in tick["env"] if e["name"].endswith("_FILE")}
        assert file_vars == {SECRET_ENV[s] for s in WORKER_SECRETS[worker]}, worker


def test_k8s_cadence_and_config_keys_are_real_settings() -> None:
    for worker, job in cronjobs().items():
        params = parse_run_tick(k8s_commands()[list(cronjobs()).index(worker)])
        if cadence(worker) < 60:
            assert job["spec"]["schedule"] == "* * * * *" and parse_duration(params["every"]) == cadence(worker)
        else:
            assert params["once"], worker
    [config] = [doc for _, doc in k8s_documents() if doc["kind"] == "ConfigMap"]
    known = {f"PAYGATE_{f.name.upper()}" for f in FIELDS} | {"TTY_INTERACTIVE"}
    assert set(config["data"]) <= known, set(config["data"]) - known


def _quorum_settings(environ: dict[str, str], config: Path | None = None) -> Settings:
    return load_settings({"XDG_CONFIG_HOME": "/nonexistent-paygate-test-config", **environ},
                         config_path=str(config) if config else None)


def test_shipped_settings_give_the_money_movers_three_read_hosts_and_no_override() -> None:
    """Production refuses a read quorum of fewer than three hosts (78 on every money mover's start):
    the ConfigMap and the host config example must ship three, and never the dev override."""
    [config] = [doc for _, doc in k8s_documents() if doc["kind"] == "ConfigMap"]
    data = {k: str(v) for k, v in config["data"].items()}
    assert "PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT" not in data
    for job in cronjobs().values():
        container = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
        assert "PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT" not in {e["name"] for e in container.get("env", [])}
    toml_example = SYSTEMD / "config.toml.example"
    for settings in (_quorum_settings(data), _quorum_settings({}, toml_example)):
        assert not settings.values["rpc_allow_single_endpoint"]
        hosts = {rpc_host(u) for u in distinct_read_urls(settings.values["rpc_read_urls"], settings.values["rpc_url"])}
        assert len(hosts) >= MIN_READ_HOSTS, hosts
        for worker in sorted(MONEY_MOVERS):
            check_read_quorum(settings, worker)  # raises ConfigError (78) below three hosts
    # The check above can fail: two of the three hosts is refused.
    two = dict(data, PAYGATE_RPC_READ_URLS=",".join(data["PAYGATE_RPC_READ_URLS"].split(",")[:2]))
    with pytest.raises(ConfigError, match="at least 3 distinct hosts"):
        check_read_quorum(_quorum_settings(two), "funding")
    for line in (ROOT / "crontab.example").read_text().splitlines():
        assert not line.startswith("PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT"), line
    for env_file in SYSTEMD.glob("tick-*.env"):
        assert not re.search(r"^PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT", env_file.read_text(), re.M), env_file


@pytest.mark.parametrize("command", cron_commands() + k8s_commands() + systemd_commands(),
                         ids=lambda c: " ".join(c))
def test_scheduled_command_parses(command: list[str]) -> None:
    assert command[0] == "run-tick" and command[1] in RESERVED_WORKER_IDS
    try:
        parse_run_tick(command)
    except ClickUsageError as exc:  # pragma: no cover - the failure message is the point
        pytest.fail(f"{' '.join(command)}: {exc.format_message()}")


# --- the image ----------------------------------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_dockerfile_builds_from_the_wheel_and_runs_as_the_pods_user() -> None:
    instructions = dockerfile_instructions()
    froms = [v for k, v in instructions if k == "FROM"]
    assert froms and all(v.split()[0] == "python:3.11-slim" for v in froms)
    runs = " ".join(v for k, v in instructions if k == "RUN")
    assert "pip wheel" in runs and re.search(r"pip install [^&]*\.whl", runs)
    [user] = [v for k, v in instructions if k == "USER"]  # exactly one, after the installs
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert [k for k, _ in instructions].index("USER") > max(i for i, (k, _) in enumerate(instructions) if k == "RUN")
    import json

    [entrypoint] = [json.loads(v) for k, v in instructions if k == "ENTRYPOINT"]
    assert Path(entrypoint[0]).name == "paygate"
    for job in cronjobs().values():
        pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == int(uid)
        assert "command" not in pod["containers"][0]  # args go to the image's paygate entrypoint
