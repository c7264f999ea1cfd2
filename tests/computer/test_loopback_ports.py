"""Which host-loopback ports a turn's sandbox may reach: the crew server's, local models', extras."""

from __future__ import annotations

import pytest

from computer_service.engine.loopback_ports import loopback_port, sandbox_loopback_ports


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("http://127.0.0.1:8080", 8080),
        ("http://localhost:11434/v1", 11434),
        ("http://127.1.2.3:9", 9),
        ("http://[::1]:1234/v1", 1234),
        ("http://localhost/v1", 80),
        ("https://LOCALHOST/v1", 443),
        ("https://api.example.com/v1", None),
        ("http://192.168.1.5:8080", None),  # the LAN: reached through the sandbox's outbound
        ("http://0.0.0.0:8080", None),
        ("http://127.0.0.1:99999", None),  # not a port
        ("not a url", None),
        ("", None),
    ],
)
def test_loopback_port(url: str, port: int | None) -> None:
    assert loopback_port(url) == port


def test_server_models_and_extras() -> None:
    providers = {
        "ollama": {"options": {"baseURL": "http://localhost:11434/v1"}},
        "lmstudio": {"options": {"baseURL": "http://127.0.0.1:1234/v1"}},
        "anthropic": {"options": {"baseURL": "https://api.anthropic.com"}},
        "odd": {"options": "not a dict"},
        "bare": {},
        "broken": "x",
    }
    ports = sandbox_loopback_ports("http://127.0.0.1:8080", providers, [5432, 1234])
    assert ports == [1234, 5432, 8080, 11434]
    assert sandbox_loopback_ports("https://crew.example.com", None) == []
