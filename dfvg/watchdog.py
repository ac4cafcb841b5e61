"""Calls with a deadline: a draft device that hangs must not hang the generation.

Owns `Watchdog`, which runs each call on a daemon worker thread and waits at most a deadline for it, and
`in_callers_mode`, which carries torch's thread-local inference/grad mode onto such a thread.

Why a thread: a hung CUDA or XRT call cannot be interrupted from Python (no exception reaches code that
sits inside a driver call), so the only way to keep going is to stop waiting for it. On a timeout the
watchdog abandons its worker (the call may finish one day, or never) and starts a fresh worker for the
next call. The worker is a daemon: an abandoned call never keeps the process from exiting (a
`ThreadPoolExecutor` joins its threads at exit and would). What the abandoned call still holds - the
drafter's caches, its generator - is the caller's to never touch again (`dfvg.fallback` gives it a
private generator and does not use that drafter until the call has returned).

Does not own: what counts as a fault or what happens next (`dfvg.fallback`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch


def in_callers_mode(fn: Callable) -> Callable:
    """fn, to run on a worker thread under the caller's inference/grad mode.

    Both modes are thread-local in torch: KV caches allocated under `inference_mode` (as `dfvg generate`
    and `dfvg run` do) can only be updated in place by a thread that is in inference mode too.
    """
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def call(*args):
        with torch.inference_mode(inference), torch.set_grad_enabled(grad and not inference):
            return fn(*args)

    return call


class DeadlineMissed(Exception):
    """A watched call did not return within its deadline; `call` is the abandoned call (it may still end)."""

    def __init__(self, deadline_s: float, call: Future):
        super().__init__(f"no result within the watchdog deadline of {deadline_s:.3g} s")
        self.deadline_s, self.call = deadline_s, call


class _Worker:
    """One daemon thread running submitted callables in order."""

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="dfvg-watchdog", daemon=True).start()

    def submit(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        self.jobs.put((future, fn))
        return future

    def _loop(self) -> None:
        while True:
            future, fn = self.jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as error:  # handed to the waiting caller, which decides
                future.set_exception(error)


class Watchdog:
    """Runs calls on a worker thread and waits at most `deadline_s` for each (None: runs it inline)."""

    def __init__(self):
        self._worker: _Worker | None = None

    def call(self, fn: Callable[[], Any], deadline_s: float | None) -> Any:
        """fn()'s result or exception; `DeadlineMissed` when it takes longer than deadline_s."""
        if deadline_s is None:
            return fn()
        if self._worker is None:
            self._worker = _Worker()
        future = self._worker.submit(in_callers_mode(fn))
        try:
            return future.result(timeout=deadline_s)
        except FutureTimeout:
            self._worker = None  # abandoned with its call: the next call gets a fresh thread
            raise DeadlineMissed(deadline_s, future) from None
