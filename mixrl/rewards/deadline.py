"""A wall-clock limit on one reward call, and a way for SIGINT / SIGTERM to end a call that hangs.

A reward function is the user's code and may hang (a catastrophic regex, a network call, an
endless loop). TRL calls it on the main thread, so while it runs nothing else of the
trainer does: a SIGTERM handler that only sets a flag for "the end of this step" would wait
forever. Two mechanisms, both on the main thread (elsewhere the call runs without them):

* :func:`deadline` (``reward.timeout_s``): a watchdog thread sends ``SIGUSR1`` to the main
  thread when the call outlives its limit; the handler raises :class:`RewardTimeout` inside
  the reward. The reward itself keeps running on the main thread, so rewards that use their
  own ``SIGALRM`` timeouts (math-verify's ``parsing_timeout``) keep them.
* :func:`in_reward_call`: true while a reward runs; the interrupt guard
  (:class:`mixrl.trainer.guards.InterruptGuard`) then raises :class:`RewardInterrupted` at
  once instead of waiting for the step to end, and the run saves a checkpoint and stops.

Both interrupt Python code and blocking sleeps/waits; C code that never returns to the
interpreter (one huge regex match) cannot be interrupted by any signal handler.
"""

from __future__ import annotations

import contextlib
import signal
import threading

from mixrl.errors import RewardError, RunInterrupted

#: the signal the watchdog sends; SIGALRM is left to the reward functions' own timeouts
WATCHDOG_SIGNAL = signal.SIGUSR1

_depth = 0  # reward calls in progress on the main thread (a reward may call another)


class RewardTimeout(BaseException):
    """Raised inside a reward call that outlived ``reward.timeout_s``. A ``BaseException``
    (like ``KeyboardInterrupt``), so that a reward's own ``except Exception`` cannot swallow it."""


class RewardSignal(BaseException):
    """Raised inside a reward call by the interrupt guard on SIGINT / SIGTERM (a
    ``BaseException`` for the same reason); ``args[0]`` is the signal's name."""


class RewardTooSlow(RewardError):
    """A reward call outlived ``reward.timeout_s`` (the one-line error)."""


class RewardInterrupted(RunInterrupted):
    """SIGINT / SIGTERM arrived while a reward function was running (the one-line error)."""


def in_reward_call() -> bool:
    """True while a reward function runs on the main thread under :func:`deadline`."""
    return _depth > 0


@contextlib.contextmanager
def deadline(seconds: float | None):
    """Run the body with a wall-clock limit of ``seconds`` (None or 0: none); raises
    :class:`RewardTimeout` in the body when it is exceeded. Off the main thread the body runs
    without a limit (signals reach only the main thread)."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    done = threading.Event()
    fired = threading.Event()
    watchdog = None
    old = None
    if seconds:
        main_id = threading.main_thread().ident

        def on_watchdog(signum, frame):
            if fired.is_set() and not done.is_set():
                raise RewardTimeout(f"no result after {seconds:g} s")
            if callable(old):  # not the watchdog's: a scheduler's SIGUSR1 (preemption warning) goes to the interrupt guard
                old(signum, frame)

        def watch():
            if not done.wait(float(seconds)):
                fired.set()
                while not done.is_set():  # repeat: a signal may land while the reward is in C code
                    signal.pthread_kill(main_id, WATCHDOG_SIGNAL)
                    done.wait(1.0)

        old = signal.signal(WATCHDOG_SIGNAL, on_watchdog)
        watchdog = threading.Thread(target=watch, name="mixrl-reward-watchdog", daemon=True)
        watchdog.start()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        done.set()
        if watchdog is not None:
            watchdog.join()
            signal.signal(WATCHDOG_SIGNAL, old)
