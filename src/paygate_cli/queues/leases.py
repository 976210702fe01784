"""The lease columns every queue table shares (lease_token, lease_expires_at): the SQL that takes,
renews and releases a lease, written once. What is claimable differs per table, so each claim is its
queue's own statement; what a claim, a renewal and a release write comes from here.

A claim writes a fresh token: every later write of the holder checks it (the CAS), so a row taken
over by recovery after its lease lapsed can never be written by the slow owner it was taken from."""

from __future__ import annotations


def take(seconds: str = "lease") -> str:
    """SET items of a claim: a new token and an expiry `%(seconds)s` from now."""
    return f"lease_token = gen_random_uuid(), lease_expires_at = now() + make_interval(secs => %({seconds})s)"


def renew(alias: str, seconds: str = "lease") -> str:
    """SET item of a renewal: never shortens a lease another statement of the same holder lengthened."""
    return (f"lease_expires_at = greatest({alias}.lease_expires_at, "
            f"now() + make_interval(secs => %({seconds})s))")


# SET items of a release (the row goes back to claimable, or to a terminal state).
RELEASE = "lease_token = NULL, lease_expires_at = NULL"


def hold(table: str, alias: str, held: str, *, key: str = "id", key_param: str = "row_id",
         token_param: str = "row_token") -> str:
    """The lease check of one row: lock it iff our lease still holds and the row is still in flight
    (`held`, e.g. "r.status = 'queued'"). Zero rows means the lease was lost: write nothing."""
    return (f"SELECT 1 FROM paygate.{table} {alias}\n"
            f"WHERE {alias}.{key} = %({key_param})s AND {held} AND {alias}.lease_token = %({token_param})s\n"
            f"FOR UPDATE OF {alias}\n")


def hold_many(table: str, alias: str, held: str, *, key: str = "id") -> str:
    """The same check for a tick's rows at once, named by the request `req` (row_id, row_token):
    the rows whose lease still holds, locked (journal/engine.py's one-statement phases)."""
    return (f"SELECT {alias}.{key} AS row_id FROM paygate.{table} {alias} JOIN req ON {alias}.{key} = req.row_id\n"
            f"WHERE {held} AND {alias}.lease_token = req.row_token FOR UPDATE OF {alias}\n")
