"""Markdown in message bodies and turn text, rendered on the server and made safe.

Agents are told "Markdown is fine" and write code fences, lists and links. What they
write is hostile input to the page, so it goes through two independent layers:

1. markdown-it-py with the CommonMark preset and `html=False`: raw HTML in the text is
   shown escaped, never passed through, and its link check already refuses
   `javascript:`, `vbscript:`, `file:` and most `data:` URLs. Images are not images here:
   `![alt](url)` becomes a plain link with the alt text, so a message can never make the
   browser fetch anything. Headings become bold paragraphs (a message's `# Build` is not
   a heading of the page), tables sit in a scrolling wrapper, and `@handle` mentions are
   marked on text tokens only, so code spans and code blocks keep theirs as written.
2. nh3 (the Rust `ammonia` allow-list sanitizer) over that output: only the tags and
   attributes listed below survive, links keep only http, https and mailto (or a path of
   this site) and get `rel="noopener noreferrer"`.

The CSP (render.py) is the third layer: even markup that slipped through could not run a
script or load a remote image.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import nh3
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
from markdown_it.renderer import RendererHTML
from markdown_it.rules_core import StateCore
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from markupsafe import Markup, escape

# A message body is at most 20,000 characters (models.Body); turn text has no such bound,
# so past this much it is shown as plain escaped text instead of parsed.
MAX_MARKDOWN_CHARS = 50_000
# A table's rows are filled up to its header's width, so a wide header over many short
# lines is a "table bomb" (20 KB of text, 64,000 cells, a second to parse). Past this
# many possible cells the text is parsed without tables: the pipes show as written.
MAX_TABLE_CELLS = 5_000
_DELIMITER_CHARS = frozenset("|:- \t")
_DASHES = re.compile(r"-+")  # one run of dashes per column of a delimiter row
MENTION = re.compile(r"@([a-z0-9_-]{1,32})")

ALLOWED_TAGS = {
    "p", "br", "strong", "em", "del", "s", "code", "pre", "blockquote", "hr",
    "ul", "ol", "li", "a", "span", "div",
    "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {"a": {"href"}, "ol": {"start"}}
ALLOWED_CLASSES = {"span": {"mention"}, "p": {"md-heading"}, "div": {"md-table"}}
URL_SCHEMES = {"http", "https", "mailto"}


def markdown(text: str | None) -> Markup:
    """`text` as safe HTML: Markdown rendered, then cleaned by the allow-list."""
    if not text:
        return Markup("")
    return _rendered(text)


@lru_cache(maxsize=2048)
def _rendered(text: str) -> Markup:
    # Bodies never change once posted, and a timeline renders the same ones again on
    # every page and live update: remembering the last few thousand saves the parse.
    if len(text) > MAX_MARKDOWN_CHARS:
        return Markup(f'<p class="md-plain">{_marked_mentions(str(escape(text)))}</p>')
    parser = _PARSER if _table_cells_bound(text) <= MAX_TABLE_CELLS else _PARSER_NO_TABLES
    html = parser.render(text)
    return Markup(
        nh3.clean(
            html,
            tags=ALLOWED_TAGS,
            attributes=ALLOWED_ATTRIBUTES,
            allowed_classes=ALLOWED_CLASSES,
            url_schemes=URL_SCHEMES,
            link_rel="noopener noreferrer",
            strip_comments=True,
        )
    )


def _table_cells_bound(text: str) -> int:
    """At most how many cells the tables in `text` can have: the widest delimiter row
    (`|---|:-:|`) times the number of lines. Line by line, with no regular expression
    that could backtrack over a long line of spaces."""
    lines = text.split("\n")
    widest = max(
        (len(_DASHES.findall(line)) for line in lines if _is_delimiter_row(line)), default=0
    )
    return widest * len(lines)


def _is_delimiter_row(line: str) -> bool:
    return "-" in line and _DELIMITER_CHARS.issuperset(line)


def _marked_mentions(escaped: str) -> str:
    return MENTION.sub(r'<span class="mention">@\1</span>', escaped)


# ---------------------------------------------------------------- the parser's rules


def _mention_tokens(state: StateCore) -> None:
    """Split each inline `text` token at `@handle`s into text and `mention` tokens.

    Code spans (`code_inline`) and code blocks (`fence`, `code_block`) are other token
    types, so their `@` stays as written."""
    for block in state.tokens:
        if block.type != "inline" or not block.children:
            continue
        children: list[Token] = []
        for child in block.children:
            if child.type == "text" and "@" in child.content:
                children.extend(_split_mentions(child))
            else:
                children.append(child)
        block.children = children


def _split_mentions(token: Token) -> list[Token]:
    parts: list[Token] = []
    last = 0
    for found in MENTION.finditer(token.content):
        if found.start() > last:
            parts.append(_text_token(token, token.content[last : found.start()]))
        mention = Token("mention", "span", 0)
        mention.content = found.group(1)
        parts.append(mention)
        last = found.end()
    if last < len(token.content):
        parts.append(_text_token(token, token.content[last:]))
    return parts


def _text_token(like: Token, content: str) -> Token:
    token = Token("text", "", 0, level=like.level)
    token.content = content
    return token


def _render_mention(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    return f'<span class="mention">@{escapeHtml(tokens[idx].content)}</span>'


def _render_image(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    """An image as a link to it, labelled with its alt text: nothing is fetched."""
    token = tokens[idx]
    alt = escapeHtml(self.renderInlineAsText(token.children or [], options, env))
    src = escapeHtml(str(token.attrGet("src") or ""))
    return f'<a href="{src}">{alt or "image"}</a>'


def _render_heading_open(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    return '<p class="md-heading"><strong>'


def _render_heading_close(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    return "</strong></p>\n"


def _render_table_open(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    return '<div class="md-table"><table>\n'


def _render_table_close(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    return "</table></div>\n"


def _parser(tables: bool) -> MarkdownIt:
    # `breaks`: a newline in a chat message is a new line, as people who type it mean.
    options: dict[str, Any] = {
        "html": False,
        "linkify": False,
        "typographer": False,
        "breaks": True,
    }
    md = MarkdownIt("commonmark", options).enable(
        ["table", "strikethrough"] if tables else ["strikethrough"]
    )
    md.core.ruler.push("mentions", _mention_tokens)
    md.add_render_rule("mention", _render_mention)
    md.add_render_rule("image", _render_image)
    md.add_render_rule("heading_open", _render_heading_open)
    md.add_render_rule("heading_close", _render_heading_close)
    md.add_render_rule("table_open", _render_table_open)
    md.add_render_rule("table_close", _render_table_close)
    return md


_PARSER = _parser(tables=True)
_PARSER_NO_TABLES = _parser(tables=False)
