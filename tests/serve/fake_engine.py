"""A scripted stand-in for ``hf_rstitch.batching.requests.RequestEngine`` (same API), for server tests.

Every request answers the same script of token ids, one token per ``step()`` for every running row,
so tests control exactly what the server streams and how fast. Rows join from the queue when
slots are free and leave when they finish or are cancelled, like the real engine; requests and
events are the real ``Request`` / ``Event`` classes.
"""

from __future__ import annotations

import itertools
import threading
import time

from hf_rstitch.core.roles import Role
from hf_rstitch.core.trace import StitchTrace
from hf_rstitch.batching.requests import Event, QueueFull


class FakeEngine:
    """Answers ``script`` (token ids) to every request; roles go SLM, SLM, LLM, SLM, SLM, LLM, ...

    ``step_s`` sleeps in each step (a slow model); a prompt holding ``poison`` makes ``step()``
    raise while that row runs (an engine-wide failure); ``submit`` refuses an empty prompt or a
    negative id with ``ValueError``, and more than ``max_batch + max_waiting`` requests with ``QueueFull``,
    like the real engine.
    """

    def __init__(self, script, eos=3, max_batch=4, step_s=0.0, poison=None, max_waiting=60, vocab=None):
        self.script, self.eos, self.max_batch, self.step_s, self.poison = list(script), eos, max_batch, step_s, poison
        self.max_waiting, self.vocab = max_waiting, vocab
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._waiting: list = []
        self._rows: dict = {}  # request_id -> [request, tokens, roles]
        self._cancel: set = set()
        self.submitted: list = []
        self.cancelled: list = []
        self.max_running = 0

    def submit(self, request):
        if not request.input_ids or min(request.input_ids) < 0:
            raise ValueError("input_ids must be a non-empty list of non-negative token ids")
        if self.vocab is not None and max(request.input_ids) >= self.vocab:
            raise ValueError(f"input_ids must be token ids below {self.vocab}")
        with self._lock:
            held = len(({r.request_id for r in self._waiting} | set(self._rows)) - self._cancel)
            if held >= self.capacity:
                raise QueueFull(f"{held} requests in flight (limit {self.capacity} = max_batch {self.max_batch} running "
                                f"+ max_waiting {self.max_waiting} waiting); retry later")
            if request.request_id is None:
                request.request_id = f"req-{next(self._ids)}"
            self._waiting.append(request)
            self.submitted.append(request)
        return request.request_id

    @property
    def capacity(self):
        return self.max_batch + self.max_waiting

    def cancel(self, request_id):
        with self._lock:
            self._cancel.add(request_id)

    def has_work(self):
        return bool(self._waiting or self._rows)

    @property
    def waiting(self):
        return len(self._waiting)

    @property
    def running(self):
        return len(self._rows)

    def step(self):
        events = []
        with self._lock:
            self._waiting = [r for r in self._waiting if r.request_id not in self._cancel]
            for rid in [rid for rid in self._rows if rid in self._cancel]:
                del self._rows[rid]
                self.cancelled.append(rid)
                events.append(Event(rid, None, None, True, "cancelled"))
            self._cancel.clear()
            while self._waiting and len(self._rows) < self.max_batch:
                req = self._waiting.pop(0)
                self._rows[req.request_id] = [req, [], []]
            self.max_running = max(self.max_running, len(self._rows))
            rows = list(self._rows.items())
        if self.step_s:
            time.sleep(self.step_s)
        if self.poison is not None and any(self.poison in row[0].input_ids for _, row in rows):
            raise RuntimeError("poisoned batch")
        for rid, (req, toks, roles) in rows:
            events.append(self._next(rid, req, toks, roles))
        return events

    def _next(self, rid, req, toks, roles):
        token = self.script[len(toks)] if len(toks) < len(self.script) else self.eos
        role = Role.LLM if len(toks) % 3 == 2 else Role.SLM
        toks.append(token)
        roles.append(role)
        done = token == self.eos or len(toks) >= req.max_new_tokens
        if not done:
            return Event(rid, token, role)
        with self._lock:
            self._rows.pop(rid, None)
        reason = "stop" if token == self.eos else "length"
        return Event(rid, token, role, True, reason, trace=StitchTrace(roles=list(roles)))
