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
