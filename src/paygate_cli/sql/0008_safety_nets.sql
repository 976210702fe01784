-- Safety nets and incident commands (docs/architecture.md §6, §7): findings, the reconciler's per-account
-- checks, drain reasons on lanes, and the replay history.

-- Why a lane was drained (an instance already has drain_reason).
ALTER TABLE paygate.lanes ADD COLUMN drain_reason text;

-- One table of facts a human must look at: the reconciler's unexplained drift, lane gaps, the
-- recovery worker's stuck items. `reconcile-report`, `status` and alerts all read this table.
-- A finding is open until a later check matches (resolved_at); at most one open finding per subject.
CREATE TABLE paygate.findings (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('balance_drift', 'total_drift', 'lane_gap', 'stuck')),
    subject     text NOT NULL,                 -- account address, lane address, 'contract', 'webhook_outbox:42'
    summary     text NOT NULL,
    details     jsonb NOT NULL DEFAULT '{}'::jsonb,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    seen_count  integer NOT NULL DEFAULT 1 CHECK (seen_count > 0),
    alerted_at  timestamptz,                   -- set once, when the alert went out
    resolved_at  timestamptz,
    resolved_by  text,
    CHECK ((resolved_at IS NULL) = (resolved_by IS NULL))
);
CREATE UNIQUE INDEX findings_one_open ON paygate.findings (kind, subject) WHERE resolved_at IS NULL;
CREATE INDEX findings_first_seen ON paygate.findings (first_seen);

-- The reconciler's last look at each account (a side table: the hot accounts row is not widened,
-- and the pacing walks its own index, least recently checked first).
CREATE TABLE paygate.account_checks (
    address         text PRIMARY KEY REFERENCES paygate.accounts (address),
    checked_at      timestamptz NOT NULL DEFAULT now(),
    chain_ledger    integer,
    chain_balance   numeric(39,0) NOT NULL,
    cached_balance  numeric(39,0) NOT NULL,
    in_flight       numeric(39,0) NOT NULL DEFAULT 0,   -- admitted charges not yet observed
    lagging         numeric(39,0) NOT NULL DEFAULT 0,   -- explained by events past the observer's cursor
    regime          text NOT NULL CHECK (regime IN ('match', 'in_flight', 'lagging', 'unexplained')),
    drift           numeric(40,0) NOT NULL                 -- chain - cached
);
CREATE INDEX account_checks_checked_at ON paygate.account_checks (checked_at);
CREATE INDEX account_checks_regime ON paygate.account_checks (regime) WHERE regime <> 'match';

-- The reconciler sums each checked account's admitted-but-unobserved charges: walk only those.
CREATE INDEX charges_open_account ON paygate.charges (account) WHERE status = 'authorized';
