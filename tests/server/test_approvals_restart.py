"""A pending approval card survives a restart of crew-server (issue 24): the real server
process, stopped and started again on the same database; the Computer's stream
reconnecting with the same epoch leaves the card pending too. Both are answered after.
"""

from __future__ import annotations

from pathlib import Path

from crew_testkit.crew_server_proc import start_crew_server

PUSH = "git push origin main"


def test_a_pending_card_survives_a_server_restart_and_is_answered_after(tmp_path: Path) -> None:
    db = tmp_path / "crew.db"
    with start_crew_server(tmp_path, db=db) as server:
        computer = server.create_computer("box")
        headers = server.connection(computer)
        agent = server.create_agent("ada", computer_id=computer["computer_id"])
        policy = {"preset": "careful"}
        server.client().patch(f"/api/agents/{agent['id']}", json={"permission": policy})
        room = server.create_room("dm", [agent["id"]])
        server.post(room["id"], "push it")
        claimed = server.client().post(
            f"/computer/agents/{agent['id']}/unread", json={}, headers=headers
        )
        assert claimed.status_code == 200, claimed.text
        rooms = [
            {
                "room_id": r["room"]["id"],
                "from_seq": r["messages"][0]["seq"],
                "to_seq": r["messages"][-1]["seq"],
            }
            for r in claimed.json()["rooms"]
        ]
        turn = server.client().post(
            f"/computer/agents/{agent['id']}/turns",
            json={"rooms": rooms, "input": "x", "engine": "opencode", "model": "local/scripted"},
            headers=headers,
        )
        assert turn.status_code == 201, turn.text
        body = {"request_id": "per_1", "tool": "bash", "patterns": [PUSH], "summary": PUSH}
        made = server.client().post(
            f"/computer/turns/{turn.json()['turn_id']}/approvals", json=body, headers=headers
        )
        assert made.status_code == 201, made.text
        card = made.json()

    with start_crew_server(tmp_path, db=db) as again:
        # The same Computer, the same epoch, polls again after the restart: still pending.
        polled = again.client().get(f"/computer/approvals/{card['id']}?wait=0", headers=headers)
        assert polled.status_code == 200 and polled.json()["state"] == "pending", polled.text
        listed = again.client().get("/api/approvals", params={"state": "pending"}).json()
        assert [c["id"] for c in listed] == [card["id"]]
        answered = again.client().post(f"/api/approvals/{card['id']}", json={"decision": "once"})
        assert answered.status_code == 200 and answered.json()["state"] == "allowed", answered.text
        seen = again.client().get(f"/computer/approvals/{card['id']}?wait=0", headers=headers)
        assert seen.json()["decision"] == "once"
