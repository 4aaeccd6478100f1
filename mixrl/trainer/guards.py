"""Run health: interrupts, divergence and collapse.

* :class:`InterruptGuard`: the first SIGINT / SIGTERM / SIGUSR1 asks the trainer to finish the
  current optimizer step, save a checkpoint and stop (a second one quits at once). Under a
  launcher the processes agree at every step end (one all-reduce) whether any of them was
  signalled, so a signal sent to one process only (``kill`` of rank 0) stops all of them after the
  same step, with one checkpoint; SIGTERM and SIGUSR1 (a scheduler's preemption or time-limit
  warning, e.g. SLURM's ``--signal=USR1@120``) end the run with exit status
  :data:`mixrl.errors.PREEMPTED_EXIT` once that checkpoint is saved. In a single process,
  during a reward call (which may hang) it stops the call at once (:mod:`mixrl.rewards.deadline`);
  under a launcher it does not (the other processes would wait in a collective for this one:
  ``reward.timeout_s`` bounds a hung reward there); during a
  held-out evaluation (before, every ``trainer.eval_every`` steps, after training) the
  evaluation asks :meth:`InterruptGuard.stop_requested` between batches and tokens and stops
  within seconds (:class:`mixrl.evaluation.accuracy.EvaluationInterrupted`), however long the
  evaluation: a scheduler's SIGKILL follows its SIGTERM after a grace period.
* :class:`DivergenceGuard`: a non-finite gradient (checked before the optimizer step, so
  the weights are still the last finite ones and are saved as a checkpoint) or a
  non-finite logged loss stops the run with :class:`mixrl.errors.TrainingDiverged`.
* :class:`CollapseWatch`: one warning line when the reward or held-out accuracy falls far
  below its best and stays there, or when the gradient vanishes for several steps.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
from collections import deque
from collections.abc import Callable

import torch
from transformers import TrainerCallback

from mixrl.errors import TrainingDiverged
from mixrl.rewards.deadline import RewardSignal, in_reward_call


def likely_cause(learning_rate: float | None) -> str:
    """A short guess at why values became non-finite."""
    lr = f" ({learning_rate:g})" if learning_rate is not None else ""
    return f"likely cause: learning rate{lr} too high (or a reward/loss producing inf); lower trainer.learning_rate"


# --------------------------------------------------------------------------- interrupts
def agreed_signal(signum: int | None) -> int | None:
    """The signal every process of a launched group stops on: the largest signal number any of
    them received (one all-reduce; every process calls it at the same point), None when none was
    signalled. A single process: its own."""
    import torch.distributed as dist  # deferred: only a launched run has a process group

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return signum
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([signum or 0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item()) or None


#: the signals a scheduler sends before it stops a job (SLURM: SIGTERM at preemption or the time
#: limit, the signal of ``--signal``, here SIGUSR1, some time before): they end a run that saved a
#: checkpoint with :data:`mixrl.errors.PREEMPTED_EXIT` (requeue), where SIGINT (Ctrl-C) ends it with 130
PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def _multi_process() -> bool:
    import os  # deferred: only the handler asks

    return int(os.environ.get("WORLD_SIZE", "1")) > 1


class InterruptGuard(TrainerCallback):
    """SIGINT / SIGTERM / SIGUSR1 -> save a checkpoint at the end of the current step and stop.

    ``install()`` replaces the handlers (main thread only), ``restore()`` puts them back.
    ``signum`` is the first signal this process received (None if none); ``agreed`` the signal
    all processes stopped on at a step end (:func:`agreed_signal`; this process's own in a
    single process). A second signal to this process restores the default handlers and raises
    ``KeyboardInterrupt`` at once.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self, say: Callable[[str], None] = print):
        self.signum: int | None = None
        self.agreed: int | None = None
        self.say = say
        self.doing: str | None = None  # what a signal stops now (:meth:`during`), for its message
        self._old: dict[int, object] = {}

    @contextlib.contextmanager
    def during(self, doing: str):
        """Within the block a signal's message says it stops ``doing`` (e.g. "the held-out
        evaluation; the final model is saved") instead of the training step."""
        self.doing = doing
        try:
            yield self
        finally:
            self.doing = None

    def stop_requested(self) -> bool:
        """Has a signal asked the run to stop? Under a launcher, True in every process as soon
        as one of them was signalled (one all-reduce), so the processes of an evaluation stop
        at the same batch and none waits in a collective for the others."""
        agreed = agreed_signal(self.signum)
        if agreed is not None:
            self.agreed = agreed  # a process that was not signalled itself stops too, on the same signal
        return agreed is not None

    def install(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def restore(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}

    def _handle(self, signum, frame):
        if self.signum is not None:
            if signum in PREEMPT_SIGNALS:
                # a scheduler's signal comes more than once (SLURM signals every process of the job, and the
                # launcher forwards its own copy): the run is stopping already; only SIGINT (or SIGKILL) quits now
                return
            self.restore()
            raise KeyboardInterrupt
        self.signum = signum
        if in_reward_call() and not _multi_process():  # a reward may never return: stop it now (the run saves a checkpoint)
            self.say(f"{self.name}: stopping the running reward function, saving a checkpoint, then stopping")
            raise RewardSignal(self.name)
        if self.doing is not None:
            self.say(f"{signal.Signals(signum).name}: stopping {self.doing} (again to quit now)")
            return
        again = " (Ctrl-C to quit now)" if signum in PREEMPT_SIGNALS else " (again to quit now)"
        self.say(f"{signal.Signals(signum).name}: saving a checkpoint after this step, then stopping{again}")

    @property
    def stopped(self) -> int | None:
        """The signal the run stops on (agreed at a step end, else this process's own), or None."""
        return self.agreed or self.signum

    @property
    def preempted(self) -> bool:
        """Stopped by a scheduler's signal (:data:`PREEMPT_SIGNALS`): a saved run exits to be requeued."""
        return self.stopped in PREEMPT_SIGNALS

    @property
    def name(self) -> str:
        return signal.Signals(self.stopped).name if self.stopped is not None else ""

    def on_step_end(self, args, state, control, **kwargs):
        # every process asks at every step end (the all-reduce is one integer), so all stop after the same step
        self.agreed = agreed_signal(self.signum)
        if self.agreed is not None:
            control.should_save = True
            control.should_training_stop = True
        return control


# --------------------------------------------------------------------------- divergence
def nonfinite_grad(model) -> bool:
    """True if any parameter gradient holds NaN or inf."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return False
    norms = torch._foreach_norm(grads)
    return not bool(torch.isfinite(torch.stack([n.float() for n in norms])).all())


class DivergenceGuard(TrainerCallback):
    """Stop on a non-finite gradient (before the optimizer step) or a non-finite loss.

    ``save``: a function that writes a checkpoint of the current (still finite) state and
    returns its path; called before raising :class:`TrainingDiverged`.
    """

    def __init__(self, save: Callable[[], str | None] | None = None):
        self.save = save

    def _stop(self, step: int, what: str, args, saved: str | None):
        where = f"checkpoint of the last finite state: {saved}" if saved else "no checkpoint saved"
        raise TrainingDiverged(
            f"training diverged at step {step}: {what} is not finite; {likely_cause(args.learning_rate)}; {where}"
        )

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if model is not None and nonfinite_grad(model):
            saved = self.save() if self.save and state.global_step > 0 else None
            self._stop(state.global_step + 1, "the gradient", args, saved)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        for key in ("loss", "grad_norm"):
            v = logs.get(key)
            if isinstance(v, (int, float)) and not math.isfinite(v):
                self._stop(state.global_step, f"the {key.replace('_', ' ')}", args, None)


# --------------------------------------------------------------------------- collapse
class CollapseWatch(TrainerCallback):
    """Warn (once per quantity) when a run stops learning.

    * reward (``reward_mean``): its mean over the last ``window`` steps stays below ``drop`` x
      its best such mean (and at least ``min_gap`` under it) for ``window`` more steps;
    * held-out accuracy (``eval/accuracy``, from ``trainer.eval_every``): the same test on
      single evaluations, for 2 evaluations in a row;
    * ``grad_norm`` below ``vanish`` for ``window`` consecutive steps.

    Warnings go to ``warn`` (one line each) and are kept in ``warnings``.
    """

    def __init__(self, warn: Callable[[str], None] = print, *, window: int = 5, drop: float = 0.5,
                 min_gap: float = 0.05, vanish: float = 1e-8):
        self.warn = warn
        self.drop, self.min_gap, self.vanish, self.window = drop, min_gap, vanish, window
        # log key -> (label, values averaged, low values in a row that trigger the warning)
        self.watched = {"reward_mean": ("reward", window, window), "reward": ("reward", window, window),
                        "eval/accuracy": ("held-out accuracy", 1, 2)}
        self.warnings: list[str] = []
        self._hist: dict[str, deque] = {}
        self._best: dict[str, tuple[float, int]] = {}
        self._low: dict[str, int] = {}
        self._vanished = 0
        self._warned: set[str] = set()

    def _emit(self, key: str, text: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        self.warnings.append(text)
        self.warn(text)

    def observe(self, step: int, logs: dict, learning_rate: float | None = None) -> None:
        for key, (label, smooth, patience) in self.watched.items():
            v = logs.get(key)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            hist = self._hist.setdefault(label, deque(maxlen=smooth))
            hist.append(float(v))
            if len(hist) < smooth:
                continue
            mean = sum(hist) / len(hist)
            best, best_step = self._best.get(label, (-math.inf, step))
            if mean > best:
                self._best[label] = (mean, step)
                self._low[label] = 0
                continue
            low = mean < self.drop * best and best - mean >= self.min_gap
            self._low[label] = self._low.get(label, 0) + 1 if low else 0
            if self._low[label] >= patience:
                lr = f" (learning rate {learning_rate:g} may be too high)" if learning_rate else ""
                self._emit(label, f"warning: {label} collapsed by step {step}: {mean:.3f} vs best {best:.3f} "
                                  f"at step {best_step}{lr}")
        g = logs.get("grad_norm")
        if isinstance(g, (int, float)) and math.isfinite(g):
            self._vanished = self._vanished + 1 if g < self.vanish else 0
            if self._vanished >= self.window:
                self._emit("grad", f"warning: gradients vanished: grad norm < {self.vanish:g} for {self._vanished} "
                                   f"steps up to step {step} (no learning signal: equal rewards in every group?)")

    def final_check(self, before: float | None, after: float | None, learning_rate: float | None = None) -> None:
        """Held-out accuracy after training far below the accuracy before it."""
        if before is None or after is None:
            return
        if after < self.drop * before and before - after >= self.min_gap:
            lr = f" (learning rate {learning_rate:g} may be too high)" if learning_rate else ""
            self._emit("held-out accuracy", f"warning: held-out accuracy fell from {before:.3f} before training "
                                            f"to {after:.3f} after{lr}")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and state.is_world_process_zero:
            self.observe(state.global_step, logs, args.learning_rate)
