"""Markdown in messages and turn text (crew_server/web/markdown.py): what renders, and
that hostile Markdown leaves no markup, link or image that could run or fetch anything.

Pure: the filter's output is checked as text; the browser test beside this one
(test_browser_markdown.py) checks the same in Chromium through the real server.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from crew_server.web.markdown import ALLOWED_TAGS, MAX_TABLE_CELLS, markdown
from crew_server.web.render import fragment


class Tags(HTMLParser):
    """Every start tag with its attributes, to check against the allow-list."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def tags_of(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = Tags()
    parser.feed(html)
    return parser.tags


def test_code_fences_lists_links_and_inline_code_render() -> None:
    text = (
        "**Build** is *done*:\n\n"
        "```python\nprint('hi')\n```\n\n"
        "- one\n- two\n\n"
        "1. first\n2. second\n\n"
        "See [the docs](https://example.org/docs) and run `make test`.\n\n"
        "> quoted\n\n~~old~~"
    )
    html = markdown(text)
    assert "<strong>Build</strong> is <em>done</em>" in html
    assert "<pre><code>print(&#39;hi&#39;)\n</code></pre>" in html or (
        "<pre><code>print('hi')\n</code></pre>" in html
    )
    assert "<ul>\n<li>one</li>\n<li>two</li>\n</ul>" in html
    assert "<ol>\n<li>first</li>\n<li>second</li>\n</ol>" in html
    assert '<a href="https://example.org/docs" rel="noopener noreferrer">the docs</a>' in html
    assert "<code>make test</code>" in html
    assert "<blockquote>" in html and "<s>old</s>" in html


def test_every_link_gets_rel_noopener_noreferrer() -> None:
    html = markdown("[a](https://a.example) <https://b.example/x> [m](mailto:me@example.org)")
    links = [attrs for tag, attrs in tags_of(html) if tag == "a"]
    assert len(links) == 3
    assert all(a.get("rel") == "noopener noreferrer" for a in links)
    assert [a["href"] for a in links] == [
        "https://a.example",
        "https://b.example/x",
        "mailto:me@example.org",
    ]


@pytest.mark.parametrize(
    "link",
    [
        "javascript:alert(1)",
        "JaVaScRiPt:alert(1)",
        "vbscript:msgbox(1)",
        "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
        "data:image/svg+xml,<svg onload=alert(1)>",
        "file:///etc/passwd",
        "ftp://example.org/x",
    ],
)
def test_links_of_other_schemes_are_dropped(link: str) -> None:
    for text in (f"[click]({link})", f"<{link}>", f"![pic]({link})", f"[r]: {link}\n\n[click][r]"):
        html = markdown(text)
        hrefs = [attrs.get("href") for tag, attrs in tags_of(html) if tag == "a"]
        assert all(h is None or h.startswith(("http:", "https:", "mailto:", "/")) for h in hrefs)
        assert not re.search(r'href="\s*(javascript|vbscript|data|file|ftp):', html, re.I), html


@pytest.mark.parametrize(
    "hostile",
    [
        "<script>alert(1)</script>",
        '<img src=x onerror="alert(1)">',
        "<div><p>nested <b onclick=alert(1)>bold</b></p></div>",
        "<a href='javascript:alert(1)'>x</a>",
        "<iframe src=https://evil.example></iframe>",
        "<style>body{display:none}</style>",
        "<!-- a comment --><svg onload=alert(1)>",
        "**<img src=x onerror=alert(1)>**",
        "- <script>alert(1)</script>\n- > <img src=x>",
    ],
)
def test_raw_html_is_shown_escaped_never_as_markup(hostile: str) -> None:
    html = markdown(hostile)
    assert {tag for tag, _ in tags_of(html)} <= ALLOWED_TAGS
    for tag, attrs in tags_of(html):
        assert not any(name.startswith("on") or name == "style" for name in attrs), (tag, attrs)
    assert "&lt;" in html  # it is there, as text


def test_images_become_links_and_nothing_is_fetched() -> None:
    html = markdown("![a cat](https://cdn.example/cat.png) ![](data:image/png;base64,AAAA)")
    assert "<img" not in html
    assert '<a href="https://cdn.example/cat.png" rel="noopener noreferrer">a cat</a>' in html
    assert "base64" not in html  # the data URL is neither a link nor shown


def test_headings_are_bold_paragraphs_not_page_headings() -> None:
    html = markdown("# Build\n\n## Steps")
    assert not re.search(r"<h\d", html)
    assert '<p class="md-heading"><strong>Build</strong></p>' in html


def test_mentions_are_marked_but_not_in_code() -> None:
    html = markdown("Hi @ada, run `crew reply @bob` then\n\n```\n@carol\n```\n\n- ask @dan")
    assert '<span class="mention">@ada</span>' in html
    assert '<span class="mention">@dan</span>' in html
    assert "<code>crew reply @bob</code>" in html
    assert "<pre><code>@carol\n</code></pre>" in html
    assert html.count('class="mention"') == 2


def test_a_small_table_renders_in_its_scrolling_wrapper() -> None:
    html = markdown("| a | b |\n|---|:-:|\n| 1 | 2 |")
    assert html.startswith('<div class="md-table"><table>')
    assert "<th>a</th>" in html and "<td>2</td>" in html
    assert "style=" not in html  # alignment would be an inline style, which the CSP refuses


def test_a_table_bomb_is_not_expanded() -> None:
    # A 2,000-column header over 6,000 short lines: 20 KB a table would fill to 12
    # million cells (markdown-it-py's own limit stops at 65,536, a second of parsing).
    columns = 2_000
    bomb = "|" + "a|" * columns + "\n|" + "-|" * columns + "\n" + "x\n" * 6_000
    html = markdown(bomb)
    assert "<td" not in html and "<table" not in html
    assert len(html) < 3 * len(bomb)


def test_a_table_just_under_the_bound_renders() -> None:
    rows = MAX_TABLE_CELLS // 3 - 3  # with the two header lines and the end: the bound
    table = "| a | b | c |\n|---|---|---|\n" + "| 1 | 2 | 3 |\n" * rows
    html = markdown(table)
    assert html.count("<td>") == 3 * rows


def test_overlong_text_is_shown_as_escaped_text() -> None:
    text = "**bold** <b>x</b> @ada " * 3_000
    html = markdown(text)
    assert html.startswith('<p class="md-plain">') and "<strong>" not in html
    assert "&lt;b&gt;" in html and '<span class="mention">@ada</span>' in html


def test_the_message_partial_renders_its_body_as_markdown() -> None:
    message = {
        "id": "m1",
        "seq": 1,
        "kind": "normal",
        "body": "Run `make` <script>x</script>",
        "created_at": "2026-12-01T01:02:03.456Z",
        "author": {"kind": "agent", "name": "Ada", "handle": "ada"},
        "task": None,
        "approval": None,
        "thread": None,
    }
    room = {"id": "r1", "kind": "dm"}
    html = fragment("_message.html", {"message": message, "room": room, "in_thread": True})
    assert (
        '<div class="body md"><p>Run <code>make</code> &lt;script&gt;x&lt;/script&gt;</p>' in html
    )


def test_turn_text_and_reasoning_render_as_markdown() -> None:
    for kind in ("text", "reasoning"):
        event = {
            "index": 3,
            "type": kind,
            "at": "2026-12-01T00:00:00Z",
            "data": {"text": "- a\n- b"},
        }
        html = fragment("_turn_event.html", {"event": event})
        assert '<div class="md"><ul>\n<li>a</li>\n<li>b</li>\n</ul>' in html, html
