"""Credentials by reference: a start may name an AWS Secrets Manager secret
(``"auth": {"secret": "<name or ARN>"}``); the worker that runs the connection reads it
at connect time. Only references under the deployment's allowed prefix
(``ALLOWED_SECRET_PREFIX``, the same prefix the task role may read) are accepted; the
reference is stored on the connection item, the secret's value never is.

Pure: the router validates with :func:`check_secret_ref`; the stacks scope the task
role with :func:`secret_arn_pattern`.
"""

from __future__ import annotations

import re
from typing import Final

MAX_REF_CHARS: Final = 2048
_NAME = re.compile(r"^[A-Za-z0-9/_+=.@-]{1,512}$")
_ARN = re.compile(
    r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:(?P<name>[A-Za-z0-9/_+=.@-]{1,512})$"
)
_PREFIX = re.compile(r"^[A-Za-z0-9/_+=.@-]{1,256}$")


class InvalidSecretRefError(ValueError):
    """The reference cannot be used; the message says why (never a secret value)."""


def check_prefix(prefix: str) -> str:
    """A usable prefix: a non-empty secret name start such as ``websocket-fleet/``."""
    if not _PREFIX.match(prefix):
        raise InvalidSecretRefError(
            f"the secret prefix must be 1 to 256 letters, digits or /_+=.@-, got {prefix!r}"
        )
    return prefix


def secret_name(ref: str) -> str:
    """The secret's name in ``ref`` (a name, or the name inside an ARN; an ARN's name
    ends with Secrets Manager's random suffix, which the prefix check does not mind)."""
    match = _ARN.match(ref)
    return match.group("name") if match else ref


def check_secret_ref(ref: object, prefix: str | None) -> str:
    """``ref`` when it names a secret under ``prefix``; raises otherwise. ``prefix``
    None: this deployment accepts no credentials at all."""
    if prefix is None:
        raise InvalidSecretRefError(
            "this deployment accepts no secret references (ALLOWED_SECRET_PREFIX is not set)"
        )
    if not isinstance(ref, str) or not ref or len(ref) > MAX_REF_CHARS:
        raise InvalidSecretRefError("auth.secret must be a secret name or ARN")
    if not (_ARN.match(ref) or _NAME.match(ref)):
        raise InvalidSecretRefError(
            "auth.secret must be a Secrets Manager secret name (letters, digits and "
            "/_+=.@-) or a secret ARN"
        )
    if not secret_name(ref).startswith(prefix):
        raise InvalidSecretRefError(f"auth.secret must name a secret under {prefix!r}")
    return ref


def secret_arn_pattern(prefix: str, *, partition: str, region: str, account: str) -> str:
    """The resource pattern of the secrets under ``prefix``, for IAM."""
    return f"arn:{partition}:secretsmanager:{region}:{account}:secret:{check_prefix(prefix)}*"
