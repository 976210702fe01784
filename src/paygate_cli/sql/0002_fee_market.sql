-- The fee market (docs/architecture.md §4 "Fees and the fee market"): every envelope's inclusion bid
-- comes from getFeeStats, bounded by the path's cap; a sent lineage that starves is re-bumped (a new
-- fee-bump envelope around the same inner transaction, journaled before it is broadcast); a lineage
-- whose market price is over its cap is fee-capped: it waits, it is never failed for the fee alone.

-- What the lineage's current outer envelope bids, and what it could cost at most. The inner
-- transaction never changes (same inner hash, same sequence); `envelope`/`outer_hash`/`key_id` are
-- always the newest committed outer envelope, the one a resend sends.
ALTER TABLE paygate.lineages
    -- inclusion fee per operation the current outer envelope bids (stroops)
    ADD COLUMN bid_rate      bigint CHECK (bid_rate > 0),
    -- latest ledger when the current outer envelope was journaled: "not included after N ledgers" counts from it
    ADD COLUMN bid_ledger    integer CHECK (bid_ledger > 0),
    -- the operations the bid is paid for (the inner transaction's plus one for the fee bump)
    ADD COLUMN fee_ops       smallint CHECK (fee_ops > 0),
    -- the Soroban resource fee the inner transaction declares (charged at most, whatever the bid)
    ADD COLUMN resource_fee  bigint CHECK (resource_fee >= 0),
    -- the highest bid per operation this lineage may ever make (the path's cap when it was signed)
    ADD COLUMN cap_rate      bigint CHECK (cap_rate > 0),
    -- replacement envelopes journaled so far (at most max_replacements)
    ADD COLUMN replacements  smallint NOT NULL DEFAULT 0 CHECK (replacements >= 0),
    -- fee-capped: the market asks more than cap_rate; since when, and what rate it asked (stroops/op)
    ADD COLUMN fee_capped_at timestamptz,
    ADD COLUMN fee_required  bigint CHECK (fee_required > 0),
    ADD CONSTRAINT lineages_fee_capped_has_required CHECK ((fee_capped_at IS NULL) = (fee_required IS NULL));

-- The archive keeps every column of an archived lineage (workers/retention.py copies them by name).
ALTER TABLE paygate_archive.lineages
    ADD COLUMN bid_rate bigint, ADD COLUMN bid_ledger integer, ADD COLUMN fee_ops smallint,
    ADD COLUMN resource_fee bigint, ADD COLUMN cap_rate bigint, ADD COLUMN replacements smallint NOT NULL DEFAULT 0,
    ADD COLUMN fee_capped_at timestamptz, ADD COLUMN fee_required bigint;

-- Fee-capped live lineages, for status and the metrics (few rows; a partial index keeps the read cheap).
CREATE INDEX lineages_fee_capped ON paygate.lineages (purpose) WHERE fee_capped_at IS NOT NULL
    AND paygate.lineage_is_live(state);

-- The outer envelopes a lineage had before its current one: the outer hash and bid each replacement
-- replaced (the ciphertext is not kept: only the newest envelope is ever resent). Whichever outer
-- lands, the lineage resolves by its inner hash; this says which outer hashes were ours. The rows go
-- with their lineage when retention archives it (the archived lineage keeps its count of replacements).
CREATE TABLE paygate.lineage_envelopes (
    lineage_id   bigint NOT NULL REFERENCES paygate.lineages (id) ON DELETE CASCADE,
    replaced_by  smallint NOT NULL CHECK (replaced_by > 0),  -- the replacement number that replaced it
    outer_hash   bytea NOT NULL CHECK (length(outer_hash) = 32),
    bid_rate     bigint NOT NULL CHECK (bid_rate > 0),
    bid_ledger   integer,
    replaced_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (lineage_id, replaced_by)
);
CREATE INDEX lineage_envelopes_outer_hash ON paygate.lineage_envelopes (outer_hash);

-- The last fee market price paygate read (getFeeStats): a failed read falls back to it, never to
-- "free"; status and the metrics show it. One row.
CREATE TABLE paygate.fee_market (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    percentile   text NOT NULL CHECK (percentile ~ '^(p[0-9]{2}|max|mode)$'),
    price        bigint NOT NULL CHECK (price >= 0),  -- that percentile of sorobanInclusionFee as given: a Soroban tx's whole inclusion fee
    max_fee      bigint NOT NULL CHECK (max_fee >= 0),  -- the distribution's max
    transactions integer NOT NULL CHECK (transactions >= 0),
    ledgers      integer NOT NULL CHECK (ledgers >= 0),
    ledger       integer NOT NULL,  -- the answer's latestLedger
    endpoint     text NOT NULL,     -- host only (a URL may carry an API key)
    read_at      timestamptz NOT NULL DEFAULT now()
);

-- The gas monitor's headroom also counts what the live signed lineages whose fee no relay reservation
-- holds could still be charged at their cap (workers/gas.py): shown beside the reserved fees.
ALTER TABLE paygate.gas_state ADD COLUMN committed_fees bigint NOT NULL DEFAULT 0 CHECK (committed_fees >= 0);
