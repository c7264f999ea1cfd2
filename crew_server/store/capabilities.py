"""Each agent's capabilities (issue 27): its MCP servers and skills, stored with the agent.

The document's rules are `crew_common.capabilities`; here it is stored (normalised,
secrets included, in `agents.capabilities`), shown to the user without secrets, and
given to the agent's Computer with them and their `capabilities_version`. A change
sends `agents` to the agent's Computer, as every change of an agent does: it re-syncs
and, seeing a new version, restarts that agent's warm server.
"""

from __future__ import annotations

from typing import Any

import orjson

from crew_common import capabilities as caps
from crew_server.errors import InvalidCapabilities, NotFound
from crew_server.store.db import StorePart, Transaction


def stored_capabilities(document: Any, stored: dict[str, Any] | None = None) -> str:
    """A document in the user's form (None: none) checked and normalised as stored; a
    "(set)" secret keeps its value in `stored` (the agent's current document).
    `InvalidCapabilities` (422) with the reason."""
    try:
        kept = caps.with_kept_secrets(document, stored or caps.EMPTY)
        return caps.canonical(caps.normalised(kept)).decode()
    except caps.CapabilitiesError as exc:
        raise InvalidCapabilities(str(exc)) from exc


def read_capabilities(raw: str) -> dict[str, Any]:
    """The stored document (secrets included)."""
    document: dict[str, Any] = orjson.loads(raw)
    return document


def synced(raw: str) -> dict[str, Any]:
    """What the Computer's agent sync adds to an agent: the document with its secrets,
    and its version."""
    document = read_capabilities(raw)
    return {"capabilities": document, "capabilities_version": caps.version(document)}


def _row(tx: Transaction, agent_id: str) -> Any:
    row = tx.execute(
        "SELECT computer_id, capabilities, capabilities_state FROM agents "
        "WHERE id = ? AND deleted_at IS NULL",
        (agent_id,),
    ).fetchone()
    if row is None:
        raise NotFound(f"no agent {agent_id}")
    return row


class AgentCapabilities(StorePart):
    """Reading and replacing an agent's capabilities."""

    def agent_capabilities(self, agent_id: str) -> dict[str, Any]:
        """The agent's capabilities as the user sees them: secrets as "(set)"."""
        with self._database.read() as tx:
            row = _row(tx, agent_id)
        return caps.redacted(read_capabilities(row["capabilities"]))

    def set_capabilities(self, agent_id: str, document: Any) -> dict[str, Any]:
        """Replace the agent's whole document (a "(set)" secret keeps its stored value);
        its Computer hears `agents`. The new document as the user sees it."""
        with self._database.write() as tx:
            row = _row(tx, agent_id)
            new = stored_capabilities(document, read_capabilities(row["capabilities"]))
            if new != row["capabilities"]:
                tx.execute("UPDATE agents SET capabilities = ? WHERE id = ?", (new, agent_id))
                if row["computer_id"] is not None:
                    tx.emit(row["computer_id"], "agents", {"agent_id": agent_id})
        return caps.redacted(read_capabilities(new))

    def set_capabilities_state(
        self, computer_id: str, agent_id: str, version: str, servers: list[dict[str, Any]]
    ) -> None:
        """The Computer's report of what it applied (`version`) and each MCP server's state."""
        with self._database.write() as tx:
            row = _row(tx, agent_id)
            if row["computer_id"] != computer_id:
                raise NotFound(f"no agent {agent_id} on this computer")
            report = {
                "capabilities_version": version,
                "mcp_servers": servers,
                "reported_at": tx.now(),
            }
            tx.execute(
                "UPDATE agents SET capabilities_state = ? WHERE id = ?",
                (orjson.dumps(report).decode(), agent_id),
            )

    def capabilities_state(self, agent_id: str) -> dict[str, Any]:
        """What its Computer last reported, and whether that is of the document stored now."""
        with self._database.read() as tx:
            row = _row(tx, agent_id)
        if row["capabilities_state"] is None:
            return {
                "current": False,
                "reported_at": None,
                "capabilities_version": None,
                "mcp_servers": [],
            }
        report = orjson.loads(row["capabilities_state"])
        version = caps.version(read_capabilities(row["capabilities"]))
        return {**report, "current": report["capabilities_version"] == version}
