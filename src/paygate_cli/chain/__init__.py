"""The only package (with devnet/) that imports stellar_sdk. Imported lazily: only ticks that have
chain work load it, so `paygate --help` and idle ticks stay fast."""
