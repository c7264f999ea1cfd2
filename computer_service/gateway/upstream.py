"""Where a provider really is: the base URL the gateway forwards an engine's calls to.

In this order: the user's own `options.baseURL` for the provider, the base
URL OpenCode's provider packages default to for the providers we know, and
the `api` field of the provider in the price table (models.dev's catalog,
which names it for the OpenAI-compatible providers). None: the gateway cannot
route the provider, and its turns fail saying how to name one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson

from computer_service import safe_fs
from computer_service.safe_fs import UnsafePath

log = logging.getLogger(__name__)

PRICE_TABLE_LIMIT = 32 * 1024 * 1024

# The defaults of the AI SDK packages OpenCode 1.18 loads for these providers.
KNOWN_BASE_URLS = {
    "anthropic": "https://api.anthropic.com/v1",
    "openai": "https://api.openai.com/v1",
    "google": "https://generativelanguage.googleapis.com/v1beta",
    "mistral": "https://api.mistral.ai/v1",
    "groq": "https://api.groq.com/openai/v1",
    "xai": "https://api.x.ai/v1",
    "deepseek": "https://api.deepseek.com/v1",
    "openrouter": "https://openrouter.ai/api/v1",
    "opencode": "https://opencode.ai/zen/v1",
}


def upstream_base(
    provider: str, user_section: dict[str, Any] | None, price_table: Path | None
) -> str | None:
    """The provider's real base URL (module doc), without a trailing slash; None if unknown."""
    options = (user_section or {}).get("options")
    if isinstance(options, dict) and isinstance(options.get("baseURL"), str):
        return str(options["baseURL"]).rstrip("/")
    if provider in KNOWN_BASE_URLS:
        return KNOWN_BASE_URLS[provider]
    api = _catalog_api(provider, price_table) if price_table is not None else None
    return api.rstrip("/") if api else None


def _catalog_api(provider: str, price_table: Path) -> str | None:
    try:
        data = safe_fs.read_trusted_file(price_table, PRICE_TABLE_LIMIT)
        catalog = orjson.loads(data) if data is not None else None
    except (UnsafePath, orjson.JSONDecodeError) as exc:
        log.warning("the price table names no base URL for %s: %s", provider, exc)
        return None
    entry = catalog.get(provider) if isinstance(catalog, dict) else None
    api = entry.get("api") if isinstance(entry, dict) else None
    return api if isinstance(api, str) and api.startswith(("http://", "https://")) else None
