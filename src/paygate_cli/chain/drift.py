"""What explains an account's balance drift (chain − cached): the reconciler's regimes, shared by the
reconciler (workers/reconciler.py) and `paygate trace account` (ops/trace/account.py), so an
operator's trace and the worker's finding never judge the same numbers differently."""

from __future__ import annotations

from collections.abc import Iterable


def lagging_effect(events: Iterable[tuple[int, str, int, str]], read_ledger: int,
                   settled_deposits: set[str] | frozenset[str]) -> tuple[int, bool]:
    """The net effect on the chain balance of billing events past the observer's cursor that are in
    the balance read at `read_ledger`: charges the chain took (−) and credits it gave for deposits
    not yet settled in the database (+). `events`: (ledger, kind, amount, deposit hash hex or charge
    id hex). -> (lagging, whether any event counted)."""
    lagging, saw = 0, False
    for ledger, kind, amount, ref in events:
        if ledger > read_ledger:
            continue  # after the balance was read: not in it
        if kind == "charge":
            lagging, saw = lagging - amount, True
        elif kind == "credit" and ref not in settled_deposits:
            lagging, saw = lagging + amount, True
    return lagging, saw


def classify(drift: int, in_flight: int, lagging: int, saw_events: bool) -> str:
    """chain − cached = drift; explained by admitted-but-unobserved charges (in_flight) plus the
    net effect of events past the cursor (lagging)? -> unexplained | lagging | in_flight | match."""
    if drift != in_flight + lagging:
        return "unexplained"
    if saw_events:
        return "lagging"
    return "in_flight" if in_flight else "match"
