"""paygate: operator toolkit and batch workers of a Stellar payment gateway."""

__version__ = "0.1.0"
