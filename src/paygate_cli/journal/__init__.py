"""The transaction journal: the AES-GCM keyring, lanes, and the lineage state machine."""
