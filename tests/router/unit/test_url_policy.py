"""The SSRF guard: which upstream URLs the router admits, as tables of URLs."""

from __future__ import annotations

import pytest

from lambdas.router.url_policy import (
    MAX_URL_CHARS,
    UrlPolicy,
    UrlRefusedError,
    check_upstream_url,
    ip_literal,
)

DEPLOYED = UrlPolicy.from_settings("*.example.com, feeds.example.net", allow_insecure_ws=False)
LOCAL = UrlPolicy.from_settings("127.0.0.1,localhost,*.example.com", allow_insecure_ws=True)
ANY_HOST = UrlPolicy.from_settings("*", allow_insecure_ws=False)


def refusal(url: str, policy: UrlPolicy) -> str | None:
    try:
        admitted = check_upstream_url(url, policy)
    except UrlRefusedError as error:
        return error.code
    assert admitted == url
    return None


ADMITTED = [
    "wss://a.example.com/stream",
    "wss://a.b.example.com/stream?symbol=ABC&depth=5",
    "wss://A.EXAMPLE.COM/stream",  # host names are case-insensitive
    "WSS://a.example.com/stream",  # so are schemes
    "wss://a.example.com./stream",  # a trailing dot is the same name
    "wss://feeds.example.net/",
    "wss://a.example.com:443/",
    "wss://a.example.com:65535/",
    "wss://xn--bcher-kva.example.com/",  # a unicode name written as punycode
    "wss://face.example.com/",  # hex letters only: still a name
    "wss://a_b.example.com/",
]


@pytest.mark.parametrize("url", ADMITTED)
def test_admitted(url: str) -> None:
    assert refusal(url, DEPLOYED) is None


@pytest.mark.parametrize(
    ("url", "code"),
    [
        # scheme
        ("ws://a.example.com/", "scheme_not_allowed"),
        ("http://a.example.com/", "scheme_not_allowed"),
        ("https://a.example.com/", "scheme_not_allowed"),
        ("file:///etc/passwd", "scheme_not_allowed"),
        ("gopher://a.example.com/", "scheme_not_allowed"),
        ("a.example.com/stream", "scheme_not_allowed"),
        ("//a.example.com/stream", "scheme_not_allowed"),
        # credentials
        ("wss://user@a.example.com/", "credentials_in_url"),
        ("wss://user:secret@a.example.com/", "credentials_in_url"),
        ("wss://:@a.example.com/", "credentials_in_url"),
        ("wss://a.example.com@evil.example.org/", "credentials_in_url"),
        # fragments, whitespace, control characters, backslashes
        ("wss://a.example.com/#frag", "invalid_url"),
        ("wss://a.example.com/#", "invalid_url"),
        ("wss://a.example.com/ x", "invalid_url"),
        ("wss://a.example.com/\tx", "invalid_url"),
        ("wss://a.example.com/\x00", "invalid_url"),
        ("wss://a.example.com/\u2028", "invalid_url"),
        ("wss://a.example.com\\@evil.example.org/", "invalid_url"),
        # ports
        ("wss://a.example.com:0/", "invalid_url"),
        ("wss://a.example.com:65536/", "invalid_url"),
        ("wss://a.example.com:-1/", "invalid_url"),
        ("wss://a.example.com:http/", "invalid_url"),
        # hosts that are not names
        ("wss://", "invalid_url"),
        ("wss:///stream", "invalid_url"),
        ("wss://a..example.com/", "invalid_url"),
        ("wss://-a.example.com/", "invalid_url"),
        ("wss://b\u00fccher.example.com/", "invalid_url"),  # unicode: use punycode
        ("wss://\u0430.example.com/", "invalid_url"),  # Cyrillic a, a look-alike
        ("wss://%61.example.com/", "invalid_url"),
        ("wss://[::1", "invalid_url"),
        ("wss://[127.0.0.1]/", "invalid_url"),
        ("wss://[not-an-address]/", "invalid_url"),
        ("wss://" + "a" * 64 + ".example.com/", "invalid_url"),  # label over 63 chars
        # the allow-list (globs on the host without the port)
        ("wss://example.com/", "host_not_allowed"),
        ("wss://evilexample.com/", "host_not_allowed"),
        ("wss://a.example.com.evil.example.org/", "host_not_allowed"),
        ("wss://feeds.example.net.evil.example.org/", "host_not_allowed"),
        ("wss://other.example.net/", "host_not_allowed"),
        ("wss://8.8.8.8/", "host_not_allowed"),  # public, but not in the list
        ("wss://[2001:4860:4860::8888]/", "host_not_allowed"),
        ("wss://localhost/", "address_not_allowed"),
        ("wss://api.localhost/", "address_not_allowed"),
        # length
        ("wss://a.example.com/" + "x" * MAX_URL_CHARS, "url_too_long"),
    ],
)
def test_refused(url: str, code: str) -> None:
    assert refusal(url, DEPLOYED) == code


LOOPBACK_SPELLINGS = [
    "2130706433",  # decimal
    "0x7f000001",  # hex
    "0x7F000001",
    "0177.0.0.1",  # octal
    "0177.0000.0000.0001",
    "0x7f.0.0.1",
    "0x7f.1",
    "127.1",  # short forms
    "127.0.1",
    "017700000001",
    "0",  # 0.0.0.0
]


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
@pytest.mark.parametrize("policy", [DEPLOYED, LOCAL, ANY_HOST], ids=["deployed", "local", "any"])
def test_ip_literals_in_other_spellings_are_refused_everywhere(
    host: str, policy: UrlPolicy
) -> None:
    # Even where 127.0.0.1 itself is allowed: only the canonical spelling is.
    assert refusal(f"wss://{host}/", policy) == "invalid_url"


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.0.0.1.", "loopback, trailing dot"),
        ("127.255.255.254", "loopback"),
        ("[::1]", "IPv6 loopback"),
        ("[0:0:0:0:0:0:0:1]", "IPv6 loopback, long form"),
        ("[::ffff:127.0.0.1]", "IPv4-mapped loopback"),
        ("[::ffff:7f00:1]", "IPv4-mapped loopback, hex"),
        ("[::ffff:169.254.169.254]", "IPv4-mapped metadata"),
        ("[64:ff9b::a9fe:a9fe]", "NAT64 of 169.254.169.254"),
        ("[64:ff9b::7f00:1]", "NAT64 of loopback"),
        ("[64:ff9b:1::a9fe:a9fe]", "local-use NAT64"),
        ("[2002:7f00:1::]", "6to4 of loopback"),
        ("[2002:a9fe:a9fe::]", "6to4 of the metadata address"),
        ("[2001:0:4136:e378:8000:63bf:3fff:fdd2]", "Teredo"),
        ("169.254.169.254", "link-local (instance metadata)"),
        ("[fe80::1]", "IPv6 link-local"),
        ("[fe80::1%25eth0]", "IPv6 link-local with a zone"),
        ("[fd00:ec2::254]", "instance metadata over IPv6"),
        ("[fc00::1]", "unique local"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "CGNAT"),
        ("0.0.0.0", "unspecified"),
        ("[::]", "IPv6 unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("[ff02::1]", "IPv6 multicast"),
        ("255.255.255.255", "broadcast"),
        ("198.18.0.1", "benchmarking"),
        ("192.0.2.1", "documentation"),
        ("240.0.0.1", "reserved"),
    ],
)
def test_non_public_addresses_are_refused(host: str, why: str) -> None:
    assert refusal(f"wss://{host}/", DEPLOYED) == "address_not_allowed", why
    assert refusal(f"wss://{host}/", ANY_HOST) == "address_not_allowed", why


def test_an_explicitly_listed_loopback_literal_is_allowed() -> None:
    assert refusal("wss://127.0.0.1:8765/demo", LOCAL) is None
    assert refusal("ws://127.0.0.1:8765/demo", LOCAL) is None
    assert refusal("ws://localhost:8765/demo", LOCAL) is None
    # ... but only that address, in that spelling
    assert refusal("ws://127.0.0.2:8765/", LOCAL) == "address_not_allowed"
    assert refusal("ws://[::1]:8765/", LOCAL) == "address_not_allowed"
    assert refusal("ws://[::ffff:127.0.0.1]:8765/", LOCAL) == "address_not_allowed"
    assert refusal("ws://127.1:8765/", LOCAL) == "invalid_url"


def test_an_explicitly_listed_private_address_is_allowed() -> None:
    policy = UrlPolicy.from_settings("10.1.2.3", allow_insecure_ws=False)
    assert refusal("wss://10.1.2.3/", policy) is None
    assert refusal("wss://10.1.2.4/", policy) == "address_not_allowed"


def test_a_glob_does_not_admit_private_addresses() -> None:
    policy = UrlPolicy.from_settings("10.*,127.*", allow_insecure_ws=False)
    assert refusal("wss://10.1.2.3/", policy) == "address_not_allowed"
    assert refusal("wss://127.0.0.1/", policy) == "address_not_allowed"


def test_public_addresses_pass_when_the_list_admits_them() -> None:
    assert refusal("wss://8.8.8.8/", ANY_HOST) is None
    assert refusal("wss://[2001:4860:4860::8888]/", ANY_HOST) is None
    assert refusal("wss://[64:ff9b::808:808]/", ANY_HOST) is None  # NAT64 of 8.8.8.8


def test_an_empty_allow_list_admits_nothing() -> None:
    policy = UrlPolicy.from_settings("", allow_insecure_ws=True)
    assert policy.allowed_hosts == ()
    assert refusal("wss://a.example.com/", policy) == "host_not_allowed"
    assert refusal("wss://8.8.8.8/", policy) == "host_not_allowed"


def test_ws_only_when_the_deployment_allows_it() -> None:
    assert refusal("ws://a.example.com/", DEPLOYED) == "scheme_not_allowed"
    assert refusal("ws://a.example.com/", LOCAL) is None
    assert refusal("http://a.example.com/", LOCAL) == "scheme_not_allowed"


def test_allow_list_settings_are_trimmed_and_lowered() -> None:
    policy = UrlPolicy.from_settings(
        " *.Example.COM , ,Feeds.Example.net ", allow_insecure_ws=False
    )
    assert policy.allowed_hosts == ("*.example.com", "feeds.example.net")


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("10.1", "10.0.0.1"),
        ("::1", "::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("example.com", None),
        ("cafe", None),
        ("face.be", None),
        ("1.2.3.4.5", None),
    ],
)
def test_ip_literal_reads_every_spelling(host: str, address: str | None) -> None:
    found = ip_literal(host)
    assert (str(found) if found is not None else None) == address
