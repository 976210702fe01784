-- A lineage whose resends are rejected tick after tick (docs/architecture.md §4): on a chain behind
-- the journal (a reset network, an RPC of another deployment) every resend answers ERROR txBAD_SEQ,
-- no rule proves the lineage dead before its maxTime, and the ticks look healthy. The lineage
-- counts its consecutive rejections with the same code (journal/rejections.py); the count reaching
-- `repeated_rejection_threshold` opens a `repeated_rejection` finding on its lane, once.

ALTER TABLE paygate.lineages
    ADD COLUMN rejected_code text,                          -- the ERROR code of the latest resends
    ADD COLUMN rejected_count integer NOT NULL DEFAULT 0     -- consecutive resends rejected with it
        CHECK (rejected_count >= 0),
    ADD COLUMN first_rejected_at timestamptz;               -- when that run of rejections began
-- Retention moves terminal lineages to the archive whole: the archive keeps every hot column.
ALTER TABLE paygate_archive.lineages
    ADD COLUMN rejected_code text,
    ADD COLUMN rejected_count integer,
    ADD COLUMN first_rejected_at timestamptz;

-- Add the kind to whatever the constraint lists now (other migrations add kinds of their own), so
-- the order these migrations land in never drops one.
DO $$
DECLARE
    kinds text[];
BEGIN
    SELECT array_agg(DISTINCT m[1]) INTO kinds
    FROM pg_constraint c, regexp_matches(pg_get_constraintdef(c.oid), '''([a-z_]+)''', 'g') AS m
    WHERE c.conname = 'findings_kind_check' AND c.conrelid = 'paygate.findings'::regclass;
    IF NOT 'repeated_rejection' = ANY(kinds) THEN
        kinds := kinds || 'repeated_rejection'::text;
    END IF;
    ALTER TABLE paygate.findings DROP CONSTRAINT findings_kind_check;
    EXECUTE format('ALTER TABLE paygate.findings ADD CONSTRAINT findings_kind_check CHECK (kind = ANY (%L::text[]))',
                   kinds);
END
$$;
