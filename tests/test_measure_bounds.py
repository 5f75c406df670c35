"""Explain's Measure is bounded like every other request (issue 35, item 4): it ran 58 s on a 1,876-token prompt
with no time limit and no heavy-slot admission, each of its iterations first in the compute gate's line."""

from __future__ import annotations

import pytest

from serve.errors import UserError
from serve.runs import CALIBRATION_PROMPT, calibrate
from serve.server import Server
from serve.settings import RequestValues


class Visitor:
    def __init__(self, session_hash: str):
        self.session_hash = session_hash


@pytest.fixture
def server(tiny_model_dir):
    """No clock limit: what these tests check must not depend on how fast the machine is (Measure is then taken
    to need MEASURE_S seconds: a heavy request)."""
    return Server(str(tiny_model_dir), max_seconds=None)


def test_measure_decodes_a_bounded_prompt_and_waits_its_turn_at_the_rows_it_needs(server, monkeypatch):
    seen, priorities = [], []
    real = server.tasks.calibration

    def spy(model_ref, ids, *args):
        seen.append(len(ids))
        return real(model_ref, ids, *args)

    turn = server.gate.turn

    def noted(priority, owner=None, threads=None):
        priorities.append(priority)
        return turn(priority, owner, threads)

    monkeypatch.setattr(server.tasks, "calibration", spy)
    monkeypatch.setattr(server.gate, "turn", noted)
    settings = server.settings(RequestValues(prompt=" ".join(f"w{i % 18}" for i in range(1876))))
    assert calibrate(server.tasks, settings, server.log) > 0
    assert seen == [CALIBRATION_PROMPT]
    decoding = [p for p in priorities if p > 0]  # the probes (threads, each call-cost call) take turns at 0
    assert len(decoding) >= 10 and min(decoding) > CALIBRATION_PROMPT  # each run's worst-case rows: not first in line


def test_measure_ends_at_the_time_limit(server):
    settings = server.settings(RequestValues(prompt="w1 w2 w3"))
    with pytest.raises(UserError, match="nothing was measured within this server's time limit of 0 s"):
        calibrate(server.tasks, settings, server.log, max_seconds=0.0)


def test_measure_is_admitted_as_a_heavy_request(server):
    from tabs.explain import ExplainHandlers

    handlers = ExplainHandlers(server)
    with server.admit(Visitor("busy"))(1e9):  # this visitor's race is running
        outputs = handlers.on_measure(RequestValues(prompt="w1 w2 w3"), Visitor("busy"))
    assert "you already have a heavy request running" in outputs[1]
    outputs = handlers.on_measure(RequestValues(prompt="w1 w2 w3"), Visitor("busy"))  # its race ended
    assert "pss-error" not in str(outputs[1])


def test_one_heavy_request_per_address_whatever_its_session_hashes(server):
    """Two races sent at once from one address, under two session hashes, took both heavy slots and every other
    visitor's race was refused as busy (issue 35)."""
    from types import SimpleNamespace

    def visitor(session: str, address: str):
        return SimpleNamespace(session_hash=session, client=SimpleNamespace(host=address))

    with server.admit(visitor("tab-1", "203.0.113.9"))(1e9):
        with pytest.raises(UserError, match="you already have a heavy request running"):
            with server.admit(visitor("tab-2", "203.0.113.9"))(1e9):
                pass
        with server.admit(visitor("other", "198.51.100.7"))(1e9):  # another address still gets the second slot
            assert server.admission.heavy_running == 2
    assert server.admission.heavy_running == 0
