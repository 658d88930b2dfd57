"""Which hosts a pull may talk to without being told otherwise.

Plain http without ``"insecure": true`` is allowed only to literal loopback
addresses (a name like ``127.evil.example`` resolves anywhere). A registry's
token URL (the ``realm`` of its ``WWW-Authenticate: Bearer`` challenge) must be
http(s) on the registry's own host and port, so a hostile registry cannot make
the server send requests to other machines or to services beside it (SSRF);
plain http there only with ``insecure``. Other token hosts are allowed by
``JUPYTER_LLM_TRUSTED_AUTH_HOSTS`` (comma-separated ``host`` or ``host:port``),
and Ollama's registry hands out tokens from ``ollama.com``.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from jupyter_llm.request.errors import PullFailed

TRUSTED_AUTH_HOSTS_ENV = "JUPYTER_LLM_TRUSTED_AUTH_HOSTS"
# registry host -> the token hosts its operator uses
KNOWN_AUTH_HOSTS = {"registry.ollama.ai": frozenset({("ollama.com", 443)})}
_DEFAULT_PORTS = {"http": 80, "https": 443}

TrustedHosts = frozenset[tuple[str, int | None]]


def is_loopback(host: str | None) -> bool:
    """``localhost``, or a literal address in 127.0.0.0/8 or ::1."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def trusted_auth_hosts(text: str) -> TrustedHosts:
    """Parse ``host[:port], ...``; a host without a port is trusted on any port."""
    hosts = set()
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        try:
            parts = urlsplit(f"//{entry}")
            port = parts.port
        except ValueError:
            parts, port = None, None
        if parts is None or not parts.hostname or parts.path or parts.username is not None:
            raise ValueError(
                f"{TRUSTED_AUTH_HOSTS_ENV}: {entry!r} is not a host or host:port "
                "(e.g. auth.example.com or auth.example.com:8443)"
            )
        hosts.add((parts.hostname, port))
    return frozenset(hosts)


def check_realm(realm: str, registry_url: str, *, insecure: bool, trusted: TrustedHosts) -> None:
    """Raise ``PullFailed`` unless the token URL ``realm`` may be called for a
    request to ``registry_url``."""

    def refuse(why: str) -> PullFailed:
        return PullFailed(f"registry token URL {realm!r} refused: {why}")

    parts = urlsplit(realm)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise refuse("it must be http(s)")
    if scheme == "http" and not insecure:
        raise refuse('plain http for tokens needs "insecure": true')
    if parts.username is not None or not parts.hostname:
        raise refuse("it must name a host, without credentials")
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError:
        raise refuse("its port is not a number") from None
    host = parts.hostname
    registry = urlsplit(registry_url)
    registry_host = registry.hostname or ""
    registry_port = registry.port or _DEFAULT_PORTS.get(registry.scheme.lower(), 0)
    if (host, port) == (registry_host, registry_port):
        return
    if (host, port) in KNOWN_AUTH_HOSTS.get(registry_host, frozenset()):
        return
    if (host, None) in trusted or (host, port) in trusted:
        return
    raise refuse(
        f"{_netloc(host, port)} is not the registry's host "
        f"({_netloc(registry_host, registry_port)}); "
        f"{TRUSTED_AUTH_HOSTS_ENV} lists the token hosts to trust"
    )


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
