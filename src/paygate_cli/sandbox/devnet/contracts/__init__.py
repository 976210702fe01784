"""Native Python models of the contracts the devnet hosts: the USDC SAC, billing and market."""
