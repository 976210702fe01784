"""Two allocators racing for one lane: the loser gets "no free lane", not an error."""

from __future__ import annotations

import psycopg

from paygate_cli.journal import lineage as lineages

LANE = "G" + "L" * 55


def test_the_loser_of_a_lane_race_gets_none_and_keeps_its_transaction(dsn: str, db: psycopg.Connection) -> None:
    lineages.sync_lanes(db, [LANE])
    with psycopg.connect(dsn) as loser:
        # The loser's snapshot predates the winner's commit (what READ COMMITTED gives a statement that
        # started just before it): the lane looks free to it, the unique index says otherwise.
        loser.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        loser.execute("SELECT count(*) FROM paygate.lineages").fetchone()
        won = lineages.allocate(db, purpose="deposit", entitlement="e:winner", lanes=[LANE])
        assert won is not None and won[1] == LANE
        assert lineages.allocate(loser, purpose="deposit", entitlement="e:loser", lanes=[LANE]) is None
        assert loser.execute("SELECT 1").fetchone() == (1,)  # the transaction is still usable
        loser.rollback()
    live = db.execute("SELECT entitlement FROM paygate.lineages WHERE state = 'allocated'").fetchall()
    assert live == [("e:winner",)]


class _LosesTheRaceFirst:
    """The connection a claim runs on, whose first `times` statements lose a lane race for real:
    another allocator's lineage on `lane` commits, and the statement inserts a live lineage on that
    lane as an allocator whose snapshot predates that commit would (Postgres's own unique violation
    on lineages_one_live_per_lane, rolled back whole). The race's timing is what cannot be produced
    on demand from outside the statement; everything after it is the real claim on the real database."""

    def __init__(self, conn: psycopg.Connection, dsn: str, lane: str, times: int = 1) -> None:
        self.conn, self.dsn, self.lane, self.times = conn, dsn, lane, times
        self.lost = 0

    def execute(self, sql: str, params: object = None) -> psycopg.Cursor:
        if self.lost < self.times:
            if self.lost == 0:
                with psycopg.connect(self.dsn, autocommit=True) as winner:
                    assert lineages.allocate(winner, purpose="deposit", entitlement="e:winner", lanes=[self.lane])
            self.lost += 1
            return self.conn.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane) "
                                     "VALUES ('charge_batch', %s, %s)", (f"e:loser-{self.lost}", self.lane))
        return self.conn.execute(sql, params)


def _charges_and_lanes(db: psycopg.Connection, lanes: list[str]) -> list[int]:
    from stellar_sdk import Keypair

    from tests.support.charges_support import admit_charge

    account = Keypair.random().public_key
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 10^12)", (account,))
    lineages.sync_lanes(db, lanes)
    return [admit_charge(db, account, 100 + i, f"k{i}")[0] for i in range(3)]


def test_a_claim_that_loses_a_lane_race_claims_again_on_the_lane_still_free(dsn: str, db: psycopg.Connection) -> None:
    import uuid

    from paygate_cli.workers import settlement

    first, second = "G" + "A" * 55, "G" + "B" * 55  # the claim prefers the first: both unused, by address
    ids = _charges_and_lanes(db, [first, second])
    racing = _LosesTheRaceFirst(db, dsn, first)
    got = settlement.claim(racing, lanes=[first, second], owner="test:0", token=uuid.uuid4(), batch=48, lease=30)
    assert racing.lost == 1
    # Not "no free lane" for the tick: the claim ran again, saw the winner's lineage and took the other lane.
    assert got.lineage_id is not None and got.lane == second and [r.id for r in got.rows] == ids
    live = db.execute("SELECT entitlement, lane FROM paygate.lineages WHERE paygate.lineage_is_live(state) "
                      "ORDER BY id").fetchall()
    assert live[0] == ("e:winner", first) and live[1][1] == second and live[1][0].startswith("charge_batch:")
    assert len(live) == 2
    assert db.execute("SELECT count(*) FROM paygate.lineages WHERE entitlement LIKE 'e:loser%'").fetchone()[0] == 0


def test_a_claim_that_loses_every_attempt_reads_as_no_free_lane_and_writes_nothing(dsn: str,
                                                                                  db: psycopg.Connection) -> None:
    import uuid

    from paygate_cli.workers import settlement

    first, second = "G" + "A" * 55, "G" + "B" * 55
    _charges_and_lanes(db, [first, second])
    racing = _LosesTheRaceFirst(db, dsn, first, times=lineages.LANE_RACE_ATTEMPTS)
    got = settlement.claim(racing, lanes=[first, second], owner="test:0", token=uuid.uuid4(), batch=48, lease=30)
    assert racing.lost == lineages.LANE_RACE_ATTEMPTS
    assert got.lineage_id is None and got.wanted  # the tick counts it as no free lane this time
    assert db.execute("SELECT count(*) FROM paygate.lineages").fetchone()[0] == 1  # the winner's alone
    assert db.execute("SELECT count(*) FROM paygate.charges WHERE claimed_at IS NOT NULL").fetchone()[0] == 0
