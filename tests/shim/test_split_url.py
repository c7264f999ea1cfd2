"""`split_url` (the shim's own URL reader, no urllib) agrees with `urllib.parse.urlsplit`."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from crew_shim.client import split_url

URLS = [
    "http://127.0.0.1:8080",
    "http://127.0.0.1:8080/",
    "https://Crew.Example/base/?x#y",
    "http://[::1]:9/p",
    "http://u:p@h:1/a/b",
    "http://h",
    "http://h?q=1",
    "HTTP://H:65535/x",
]
NOT_URLS = ["ftp://x", "http://:80", "http://h:abc", "http://h:70000", "h:80", "", "http://[::1"]


@pytest.mark.parametrize("url", URLS)
def test_it_reads_what_urlsplit_reads(url: str) -> None:
    parts = urlsplit(url)
    assert split_url(url) == (parts.scheme, parts.hostname, parts.port, parts.path)


@pytest.mark.parametrize("url", NOT_URLS)
def test_it_refuses_what_is_no_http_url(url: str) -> None:
    assert split_url(url) is None
