"""The request engine: requests joining and leaving one continuous batch, each with an explicit
:class:`RequestStatus` (waiting, running, preempted, finished), one admission rule and one queue limit.

A step is schedule -> execute -> update: :mod:`.scheduler` (admission, preemption, the KV budget of
:mod:`.kv_budget`, the joins' :mod:`.chunked_prefill`) returns a step plan; :mod:`.executor` runs it on the
batch's rows (:mod:`.batch`) with the decode layer's step (:mod:`hf_rstitch.decode`) over the lanes of a pair's
built engine (:func:`hf_rstitch.engine.build`); :mod:`.update` turns the step's outputs into events;
:mod:`.requests` ties them together (:class:`RequestEngine`). It knows nothing of HTTP: :mod:`hf_rstitch.serve` is
the OpenAI-compatible server over it, :mod:`hf_rstitch.eval.continuous` the evaluation driver.
"""

from .request_types import Completion, Event, QueueFull, Request, RequestStatus
from .requests import RequestEngine

__all__ = ["Completion", "Event", "QueueFull", "Request", "RequestEngine", "RequestStatus"]
