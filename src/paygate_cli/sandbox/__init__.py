"""What `make demo`, the tests and `paygate dev|devnet|demo` need and production never imports:
the devnet (a local Stellar RPC stand-in), the demo scenario and the private Postgres helper."""
