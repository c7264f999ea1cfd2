"""OpenCode model ids (`provider/model`): one definition for the Computer and the launcher.

The launcher refuses a run whose model does not match (it becomes part of an
argv); the Computer checks first, so the agent's problem reads as a model
that cannot be used, not as a sandbox refusal.
"""

from __future__ import annotations

import re

MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}/[A-Za-z0-9._:@+/-]{1,200}$"
_MODEL = re.compile(MODEL_PATTERN)


def is_model_id(text: str) -> bool:
    """True when `text` is `provider/model` as OpenCode names models (and the launcher takes)."""
    return _MODEL.fullmatch(text) is not None
