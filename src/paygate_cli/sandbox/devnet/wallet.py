"""A sample user's wallet for demos and runbook rehearsals: signs the SAC transfer authorisation a
deposit needs, exactly as a real wallet would (stellar-sdk `authorize_invocation`).

`upgraded` picks the credential version: ADDRESS_V2 (CAP-71, the SDK's default, address-bound
preimage) or the legacy ADDRESS a wallet on an older SDK still produces. Both must be accepted."""

from __future__ import annotations

from stellar_sdk import Keypair, scval, xdr
from stellar_sdk.auth import authorize_invocation


def sign_deposit(*, user_secret: str, amount: int, usdc: str, billing: str, passphrase: str,
                 expiration_ledger: int, upgraded: bool = True) -> tuple[str, int]:
    """-> (base64 SorobanAuthorizationEntry, nonce) authorising USDC.transfer(user, billing, amount)."""
    user = Keypair.from_secret(user_secret)
    invocation = xdr.SorobanAuthorizedInvocation(
        function=xdr.SorobanAuthorizedFunction(
            type=xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
            contract_fn=xdr.InvokeContractArgs(
                contract_address=scval.to_address(usdc).address,
                function_name=xdr.SCSymbol(b"transfer"),
                args=[scval.to_address(user.public_key), scval.to_address(billing), scval.to_int128(amount)])),
        sub_invocations=[])
    ct = xdr.SorobanCredentialsType
    entry = authorize_invocation(
        user, None, expiration_ledger, invocation, passphrase,
        credentials_type=ct.SOROBAN_CREDENTIALS_ADDRESS_V2 if upgraded else ct.SOROBAN_CREDENTIALS_ADDRESS)
    creds = entry.credentials.address_v2 or entry.credentials.address
    return entry.to_xdr(), int(creds.nonce.int64)
