"""The CLI layer: one module per command group. Parses, calls ops/ or ticks/, renders. No SQL."""
