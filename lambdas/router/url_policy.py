"""Which upstream URLs the router accepts: the guard that keeps the API from being
used to make workers connect anywhere (SSRF).

Pure: the policy is data, the check is a function of the URL and the policy.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

MAX_URL_CHARS = 2048
_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[a-z0-9_](?:[a-z0-9_-]{0,62})(?:\.[a-z0-9_](?:[a-z0-9_-]{0,62}))*$"
)
# What a host made only of these could be, to inet_aton: 127.1, 0x7f.1, 2130706433, 0177.0.0.1
_IPV4_SPELLING_RE = re.compile(r"^[0-9a-fx.]+$")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


class UrlRefusedError(ValueError):
    """The URL is not acceptable; ``code`` names the rule, the message explains."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class UrlPolicy:
    allowed_hosts: tuple[str, ...]
    """Glob patterns matched against the lower-case host name without the port."""
    allow_insecure_ws: bool = False

    @classmethod
    def from_settings(cls, hosts: str, *, allow_insecure_ws: bool) -> UrlPolicy:
        patterns = tuple(p.strip().lower() for p in hosts.split(",") if p.strip())
        return cls(allowed_hosts=patterns, allow_insecure_ws=allow_insecure_ws)


def check_upstream_url(url: str, policy: UrlPolicy) -> str:
    """Return ``url`` if the policy admits it; raise :class:`UrlRefusedError` if not."""
    if len(url) > MAX_URL_CHARS:
        raise UrlRefusedError("url_too_long", f"ws_url is longer than {MAX_URL_CHARS} chars")
    if any(ch.isspace() or ord(ch) < 0x21 or ch == "\\" for ch in url):
        raise UrlRefusedError("invalid_url", "ws_url contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise UrlRefusedError("invalid_url", f"ws_url is not a valid URL: {error}") from None
    schemes = ("wss", "ws") if policy.allow_insecure_ws else ("wss",)
    if parts.scheme not in schemes:
        allowed = " or ".join(f"{s}://" for s in schemes)
        raise UrlRefusedError("scheme_not_allowed", f"ws_url must start with {allowed}")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise UrlRefusedError("credentials_in_url", "ws_url must not carry credentials")
    if parts.fragment or url.endswith("#"):
        raise UrlRefusedError("invalid_url", "ws_url must not have a fragment")
    if port == 0:
        raise UrlRefusedError("invalid_url", "ws_url has port 0")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise UrlRefusedError("invalid_url", "ws_url has no host")
    address = ip_literal(host)
    if address is not None:
        if address.version == 4 and host != str(address):
            raise UrlRefusedError(
                "invalid_url", f"write IPv4 literals as dotted decimal ({address}), not {host!r}"
            )
        _check_ip(address, policy)
    else:
        _check_hostname(host, policy)
    return url


def ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host names when it is an IP literal in any spelling (dotted,
    decimal, hex, octal, short forms like ``127.1``, bracketed IPv6), else None."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise UrlRefusedError("invalid_url", f"malformed IPv6 literal {host!r}") from None
    if _IPV4_SPELLING_RE.fullmatch(host) and not _looks_like_name(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _looks_like_name(host: str) -> bool:
    # "face.be" or "cafe" are names; a label made of hex letters only is a name
    # unless every label is a number in some base.
    return not all(re.fullmatch(r"0x[0-9a-f]*|[0-9]+", label) for label in host.split(".") if label)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> Iterable[ipaddress.IPv4Address]:
    if address.ipv4_mapped is not None:
        yield address.ipv4_mapped
    if address.sixtofour is not None:
        yield address.sixtofour
    if address.teredo is not None:
        yield address.teredo[1]
    if any(address in net for net in _NAT64):
        yield ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)


def _is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return address.is_global and not address.is_multicast and not address.is_unspecified


def _check_ip(address: ipaddress.IPv4Address | ipaddress.IPv6Address, policy: UrlPolicy) -> None:
    canonical = str(address)
    candidates = [address, *(_embedded_ipv4(address) if address.version == 6 else ())]
    explicitly_allowed = canonical in policy.allowed_hosts
    if not explicitly_allowed and not all(_is_public(a) for a in candidates):
        raise UrlRefusedError(
            "address_not_allowed",
            f"ws_url points to a private, loopback, link-local or reserved address ({canonical})",
        )
    if not explicitly_allowed and not _matches(canonical, policy):
        raise UrlRefusedError("host_not_allowed", f"host {canonical} is not in the allow-list")


def _check_hostname(host: str, policy: UrlPolicy) -> None:
    if not _HOSTNAME_RE.fullmatch(host):
        raise UrlRefusedError("invalid_url", f"ws_url host {host!r} is not a valid host name")
    # Names that always mean loopback (RFC 6761) are as private as 127.0.0.1: a broad
    # glob such as "*" does not admit them, only the name itself in the list does.
    if (host == "localhost" or host.endswith(".localhost")) and host not in policy.allowed_hosts:
        raise UrlRefusedError(
            "address_not_allowed", f"ws_url host {host} is a loopback name not in the allow-list"
        )
    if not _matches(host, policy):
        raise UrlRefusedError("host_not_allowed", f"host {host} is not in the allow-list")


def _matches(host: str, policy: UrlPolicy) -> bool:
    return any(fnmatchcase(host, pattern) for pattern in policy.allowed_hosts)
