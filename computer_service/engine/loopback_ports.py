"""Which host-loopback ports a turn's sandbox may reach (issue 12, escape 4).

On Linux every sandbox has its own network namespace: the host's loopback
services are out of reach except the ports named here, which the launcher
forwards to the sandbox's own 127.0.0.1. They are the crew server's port
(when the server is on this machine), the port of every provider in the
user's OpenCode config whose `options.baseURL` is on loopback (a local model:
Ollama, llama.cpp, LM Studio…), and the bootstrap's `sandbox_loopback_ports`
for anything else a user needs. Pure.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
DEFAULT_PORTS = {"http": 80, "https": 443}


def loopback_port(url: str) -> int | None:
    """The port of `url` when its host is this machine's loopback, else None."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    if not host:
        return None
    if host not in LOOPBACK_NAMES:
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return None
        except ValueError:
            return None
    return port if port is not None else DEFAULT_PORTS.get(parts.scheme.lower())


def provider_urls(providers: dict[str, Any] | None) -> list[str]:
    """The `options.baseURL` of every provider in a `provider` section."""
    urls = []
    for provider in (providers or {}).values():
        options = provider.get("options") if isinstance(provider, dict) else None
        url = options.get("baseURL") if isinstance(options, dict) else None
        if isinstance(url, str):
            urls.append(url)
    return urls


def sandbox_loopback_ports(
    server_url: str, providers: dict[str, Any] | None, extra: Iterable[int] = ()
) -> list[int]:
    """The host-loopback ports a turn's sandbox reaches, sorted, each once."""
    ports = set(extra)
    for url in [server_url, *provider_urls(providers)]:
        port = loopback_port(url)
        if port is not None:
            ports.add(port)
    return sorted(ports)
