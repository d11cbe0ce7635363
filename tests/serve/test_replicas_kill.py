"""The replica kill test's counting rules (benchmarks/serve_replicas.py), on hand-made records (no Ray): a request
still streaming when the load's clients stopped is not an error, the lost-replica error and a 429 are clean ends,
anything else makes the verdict unclean."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import serve_replicas as srep  # noqa: E402

from hf_rstitch.serve.relay import LOST, lost  # noqa: E402

T_KILL = 5.0


def rec(start, end, complete=False, status=200, error=None):
    """One record as serve_clients.one_request leaves it (``end`` None: its task was cancelled mid-stream)."""
    return {"start": start, "end": end, "chunks": [], "complete": complete, "status": status, "error": error,
            "ttft_s": None}


def test_cancelled_at_load_end_is_still_streaming_not_unclean():
    records = [rec(1.0, 3.0, complete=True),  # before the kill
               rec(4.0, 5.2, error=lost(RuntimeError("ActorDiedError"))),  # on the victim: error event in its stream
               rec(4.5, 5.1, status=503, error=lost(RuntimeError("ActorDiedError"))),  # lost before its answer began
               rec(4.0, 7.0, complete=True),  # on the survivor: untouched
               rec(5.5, 5.6, status=429, error="the server is at capacity"),
               rec(6.5, 9.0, complete=True),  # sent after the kill
               rec(4.8, None), rec(8.0, None)]  # still streaming when the clients stopped
    k = srep.ended(records, T_KILL)
    assert {o: k[o] for o in srep.OUTCOMES} == {"complete": 3, "replica_lost": 2, "at_capacity": 1,
                                                "still_streaming": 2, "unclean": 0}
    assert k["clean"] and k["lost_statuses"] == [200, 503]
    assert k["in_flight_at_kill"] == {"complete": 1, "replica_lost": 2, "at_capacity": 0, "still_streaming": 1,
                                      "unclean": 0}
    assert k["sent_after_kill"]["complete"] == 1 and k["sent_after_kill"]["still_streaming"] == 1
    assert LOST in records[1]["error"]


def test_an_incomplete_end_without_the_clean_error_makes_the_verdict_unclean():
    records = [rec(4.0, 5.3, error="RemoteProtocolError: peer closed connection"),  # a cut stream
               rec(4.0, 5.3, status=500, error="Internal Server Error"),  # the proxy's plain 500
               rec(4.0, 5.4)]  # the stream ended without [DONE] or a finish reason, and no error
    k = srep.ended(records, T_KILL)
    assert k["unclean"] == 3 and not k["clean"] and k["still_streaming"] == 0
    verdict = srep.kill_verdict({**k, "replicas": 2, "victim_pid": 1, "victim_in_flight_at_kill": 3,
                                 "replaced_after_s": None})
    assert "NOT CLEAN: 3 requests" in verdict and "status 500: Internal Server Error" in verdict
