"""Sign-in codes: a link that signs a browser in without the user token in its URL.

A browser keeps every URL it opened (its history, its usage metrics), so a link must
not carry the user token. `POST /api/sign-in-codes` (with the user token) mints a
random code instead: stored only as a hash, good for `CODE_SECONDS`, and spent by its
first use (`/login#code=…`, read by the sign-in page's script and posted). A copy of
the link in a browser's history is then worth nothing. The codes live in this
process's memory, like the web sessions they turn into.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from time import monotonic

from crew_server.store.identities import hash_token

CODE_SECONDS = 10 * 60
# Outstanding codes kept: only the user can mint them, and a new one replaces the oldest.
MAX_CODES = 16


class SignInCodes:
    """The outstanding sign-in codes (hashes and when they expire)."""

    def __init__(self) -> None:
        self._expiries: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def mint(self) -> str:
        """A new single-use code (shown once: only its hash is kept)."""
        code = "csi_" + secrets.token_urlsafe(24)
        with self._lock:
            self._expiries[hash_token(code)] = monotonic() + CODE_SECONDS
            while len(self._expiries) > MAX_CODES:
                self._expiries.popitem(last=False)
        return code

    def redeem(self, code: str) -> bool:
        """Whether `code` is an unexpired code of this server; it is spent either way."""
        if not code:
            return False
        with self._lock:
            expires = self._expiries.pop(hash_token(code), None)
        return expires is not None and monotonic() <= expires
