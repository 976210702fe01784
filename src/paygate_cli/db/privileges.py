"""Least privilege: the table of decisions `paygate migrate --roles` grants from.

Every table paygate creates, in any schema, is listed here with what the runtime role may do to it
and whether the read-only role may read it, and why. Nothing is granted by wildcard: a table that is
not listed gets no privileges at all (fail closed), and tests/db/test_roles.py fails when a table exists
that this list does not mention, so a new table cannot slip through unclassified.

The runtime role is what `run-tick` (every worker) and the operator's write commands (drain/undrain,
replay, halt/resume) connect as. It never gets TRUNCATE, REFERENCES, TRIGGER or
any DDL; DELETE only where a worker deletes. The API service admits work through the SQL functions
(admit_charge, admit_deposit, ...) under its own role; the runtime role holds only what the workers
do through them (the subscriptions worker calls admit_charge). Functions run with the caller's
rights (none is SECURITY DEFINER), so table grants are the fence even where EXECUTE is open.

The read-only role is for on-call engineers: `status`, `reconcile-report`, `nonce-inspect` and `trace`
work as it, and every write (audit_log included) is refused with 42501 (exit 77). It cannot read secrets
stored in the database (webhook_endpoints.secret)."""

from __future__ import annotations

from dataclasses import dataclass

RUNTIME_ROLE = "paygate_runtime"
READONLY_ROLE = "paygate_readonly"
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")


@dataclass(frozen=True)
class TableGrant:
    table: str  # schema-qualified: "paygate.accounts"
    runtime: tuple[str, ...]  # subset of TABLE_PRIVILEGES, in that order
    readonly: bool  # SELECT for the read-only role
    why: str

    @property
    def schema(self) -> str:
        return self.table.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.table.split(".", 1)[1]

    @property
    def runtime_denied(self) -> tuple[str, ...]:
        return tuple(p for p in TABLE_PRIVILEGES if p not in self.runtime)


def _grant(table: str, runtime: str, readonly: bool, why: str) -> TableGrant:
    privileges = tuple(p for p in TABLE_PRIVILEGES if p in runtime.split())
    assert len(privileges) == len(runtime.split()), f"{table}: unknown privilege in {runtime!r}"
    return TableGrant(table, privileges, readonly, why)


# SELECT ... FOR UPDATE and INSERT ... ON CONFLICT DO UPDATE need UPDATE; both are noted where they
# are the only reason for it. "status" below means `paygate status` (queue depths, last runs).
GRANTS: tuple[TableGrant, ...] = (
    _grant("paygate.schema_migrations", "SELECT", True,
           "every command and tick checks the schema version; only `migrate` (the owner) writes"),
    _grant("paygate.schema_functions", "SELECT", True,
           "every tick compares the function files' checksums with its build's; only `migrate` (the owner) writes"),
    _grant("paygate.accounts", "SELECT UPDATE", True,
           "funding/observer/settlement move cached_balance by CAS, the reconciler reads it; accounts "
           "are created by admission (API role), never deleted"),
    _grant("paygate.idempotency_keys", "SELECT INSERT UPDATE DELETE", True,
           "subscriptions admit charges through admit_charge (insert/update the key); idempotency_sweep "
           "deletes expired keys; status counts them"),
    _grant("paygate.webhook_endpoints", "SELECT", False,
           "webhooks reads url+secret to deliver, emit_event reads the enabled endpoints; endpoints are "
           "managed by the API role. Not readable read-only: it holds the customers' HMAC secrets"),
    _grant("paygate.webhook_outbox", "SELECT INSERT UPDATE DELETE", True,
           "emit_event inserts with each state change; webhooks/recovery/replay move rows by CAS; "
           "retention moves delivered rows past the window to paygate_archive (delete)"),
    _grant("paygate.halts", "SELECT INSERT UPDATE DELETE", True,
           "halt (upsert: ON CONFLICT DO UPDATE) / resume (delete) and the gas monitor's durable halt "
           "(set, cleared by delete, FOR UPDATE)"),
    _grant("paygate.audit_log", "SELECT INSERT", True,
           "append-only: every operator write and lane fencing inserts; never UPDATE/DELETE/TRUNCATE "
           "(a trigger refuses them even for the owner)"),
    _grant("paygate.worker_runs", "SELECT INSERT UPDATE DELETE", True,
           "the tick runner writes a heartbeat row per tick, finishes it, and prunes old rows"),
    _grant("paygate.instances", "SELECT INSERT UPDATE", True,
           "the tick runner registers its instance (upsert), drain/undrain flips the drained flag"),
    _grant("paygate.lanes", "SELECT INSERT UPDATE", True,
           "lane allocation (FOR UPDATE), lane registration from the key file, fencing, drain by lane"),
    _grant("paygate.lineages", "SELECT INSERT UPDATE DELETE", True,
           "the journal: allocate (insert), anchor/send/resolve (CAS update); retention moves terminal "
           "charge_batch lineages to paygate_archive (the delete guard trigger refuses any other delete)"),
    _grant("paygate.lineage_envelopes", "SELECT INSERT", True,
           "a replacement fee bump records the outer envelope it replaced (its rows go with the lineage "
           "when retention archives it: ON DELETE CASCADE, run with the owner's rights)"),
    _grant("paygate.fee_market", "SELECT INSERT UPDATE", True,
           "the last getFeeStats price a tick read (upsert), the fallback when a read fails; status shows it"),
    _grant("paygate.deposits", "SELECT UPDATE", True,
           "funding claims and settles deposits, replay resets dead ones; deposits are inserted by "
           "admit_deposit (API role)"),
    _grant("paygate.charges", "SELECT INSERT UPDATE DELETE", True,
           "subscriptions insert through admit_charge; settlement claims, the observer settles/fails; "
           "retention moves settled/failed charges past the window to paygate_archive (delete)"),
    _grant("paygate.charge_batches", "SELECT INSERT UPDATE DELETE", True,
           "settlement opens a batch per charge_batch lineage and closes it; retention archives closed ones"),
    _grant("paygate.chain_events", "SELECT INSERT UPDATE DELETE", True,
           "the observer records each event once (unique event id) and changes only a quarantined one it "
           "re-examines (its quarantine lifted once it applies, or its reason); retention moves applied "
           "events past the window to paygate_archive (delete, no row lock)"),
    _grant("paygate.observer_cursor", "SELECT INSERT UPDATE", True,
           "the observer owns the cursor (insert on first run, then forward-only update)"),
    _grant("paygate.subscriptions", "SELECT UPDATE", True,
           "subscriptions advance the period / mark past_due (FOR UPDATE); created by the API role"),
    _grant("paygate.findings", "SELECT INSERT UPDATE", True,
           "the reconciler records and resolves drift findings; recovery and the runner read them"),
    _grant("paygate.account_checks", "SELECT INSERT UPDATE", True,
           "the reconciler's per-account rotation (upsert: ON CONFLICT DO UPDATE)"),
    _grant("paygate.relay_allowlist", "SELECT", True,
           "relay/replay check the relay allow-list; managed by the owner or API role"),
    _grant("paygate.bot_job_allowlist", "SELECT", True,
           "relay_drainer/replay check the bot-job allow-list (permissionless calls); managed by the owner"),
    _grant("paygate.relay_config", "SELECT", True,
           "gas floors, bot job limits and the fee budget are read; set by the owner"),
    _grant("paygate.relay_fee_totals", "SELECT UPDATE", True,
           "settle_relay_fee / release_relay_fee / take_relay_fee_budget move the accumulator "
           "(FOR UPDATE); one row, never inserted or deleted by a worker"),
    _grant("paygate.relays", "SELECT UPDATE", True,
           "relay/relay_expiry/recovery/replay move relays by CAS; admitted by admit_relay (API role)"),
    _grant("paygate.fee_reservations", "SELECT INSERT UPDATE", True,
           "settle/release by the relay path, a fresh reservation when replay revives a relay"),
    _grant("paygate.bot_jobs", "SELECT UPDATE", True,
           "relay_drainer claims and finishes bot jobs, replay resets dead ones; admitted by the API role"),
    _grant("paygate.gas_state", "SELECT INSERT UPDATE", True,
           "the gas monitor's state row (upsert, FOR UPDATE); status shows it"),
    _grant("paygate.ttl_entries", "SELECT INSERT UPDATE", True,
           "the TTL keeper records what it read of each entry paygate keeps alive (upsert) and its restores"),
    _grant("paygate.ttl_jobs", "SELECT INSERT UPDATE", True,
           "the TTL keeper claims and finishes extend/restore jobs; a money path that meets a restorePreamble "
           "requests a restore (insert)"),
    _grant("paygate.ttl_rent", "SELECT INSERT UPDATE", True,
           "the TTL keeper adds the rent it paid per UTC day (upsert); status shows it"),
    _grant("paygate.db_identity", "SELECT INSERT UPDATE", True,
           "every tick compares the database's identity with this row (check_db_identity: the first "
           "record); a clean recovery pass records the new one after a restore or promotion"),
    _grant("paygate.retention_totals", "SELECT UPDATE", True,
           "retention adds the settled amount it archives (one row, updated in the archiving statement); "
           "the reconciler reads it"),
    # The archive (sql/0001_baseline.sql, "Retention"): append-only for the runtime role, readable on call.
    *(_grant(f"paygate_archive.{table}", "SELECT INSERT", True,
             "retention inserts the rows it deletes from the hot table in the same statement; archived "
             "rows are never changed or deleted by a worker")
      for table in ("charges", "charge_batches", "lineages", "chain_events", "webhook_outbox", "worker_runs")),
)

BY_TABLE: dict[str, TableGrant] = {g.table: g for g in GRANTS}
SCHEMAS: tuple[str, ...] = tuple(dict.fromkeys(g.schema for g in GRANTS))

# Every relation in a non-system schema of the database, for the coverage check and for the
# revoke-everything step (a table nobody classified gets nothing).
USER_TABLES_SQL = """
SELECT n.nspname || '.' || c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
  AND n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
ORDER BY 1
"""
