"""One module per worker; each exposes `tick(ctx) -> TickResult`."""
