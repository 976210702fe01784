"""One module per queue table: every statement that moves its rows, named by purpose (claim, renew,
release, settle, fail, replay, depth rows). Workers hold the flow of their phases; the statements
that change a queue's rows live here, next to the why of each (docs/states.md has the diagrams)."""
