"""Bootstrap parsing: clear errors, never the token in them."""

from __future__ import annotations

from pathlib import Path

import pytest

from computer_service.bootstrap import BootstrapError, parse_bootstrap

SECRET = "tok-very-secret-123"


def test_valid_bootstrap_with_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CREW_HOME", str(tmp_path / "ch"))
    boot = parse_bootstrap(b'{"server_url": "http://127.0.0.1:8765/", "token": "t"}\n')
    assert boot.server_url == "http://127.0.0.1:8765"
    assert boot.resolved_crew_home() == tmp_path / "ch"
    assert boot.turn_capacity() >= 2
    assert SECRET not in repr(
        parse_bootstrap(f'{{"server_url":"http://x","token":"{SECRET}"}}'.encode())
    )


def test_explicit_fields() -> None:
    boot = parse_bootstrap(
        b'{"server_url":"https://crew.example","token":"t","crew_home":"/tmp/x",'
        b'"max_concurrent_turns":3,"opencode_path":"/bin/oc","sandbox_mode":"tmpfs"}'
    )
    assert boot.resolved_crew_home() == Path("/tmp/x")
    assert boot.turn_capacity() == 3
    assert boot.sandbox_mode == "tmpfs"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"", "no bootstrap received"),
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"server_url": "http://x"}', "token"),
        (f'{{"server_url": "ftp://x", "token": "{SECRET}"}}'.encode(), "server_url"),
        (f'{{"server_url": "http://x", "token": "{SECRET}", "extra": 1}}'.encode(), "extra"),
        (
            f'{{"server_url": "http://x", "token": "{SECRET}", "max_concurrent_turns": 0}}'.encode(),
            "max_concurrent_turns",
        ),
        (
            f'{{"server_url": "http://x", "token": "{SECRET}", "sandbox_mode": "none"}}'.encode(),
            "sandbox_mode",
        ),
        (b"{" * 70000, "over"),
    ],
)
def test_garbage_is_refused_clearly_without_the_token(line: bytes, expected: str) -> None:
    with pytest.raises(BootstrapError) as info:
        parse_bootstrap(line)
    message = str(info.value)
    assert expected in message
    assert SECRET not in message
    assert "\n" not in message


def test_turn_time_limit_defaults_to_30_minutes_and_is_checked() -> None:
    base = '{"server_url": "http://x", "token": "t"'
    assert parse_bootstrap(f"{base}}}".encode()).turn_time_limit_s == 30 * 60
    assert (
        parse_bootstrap(f'{base}, "turn_time_limit_s": 7200}}'.encode()).turn_time_limit_s == 7200
    )
    for bad in ("0", '"60"', "true", "1.5", str(10**9)):
        with pytest.raises(BootstrapError, match="turn_time_limit_s"):
            parse_bootstrap(f'{base}, "turn_time_limit_s": {bad}}}'.encode())
