"""The wrapper every reward is built into: :class:`CheckedReward` checks what a reward returns,
bounds its time, keeps a dense reward's per-token lists, and exposes the reward's declared protocol
(:mod:`mixrl.rewards.protocol`)."""

from __future__ import annotations

import math
from typing import Any

from mixrl.errors import MixrlUserError, RewardError
from mixrl.rewards.deadline import RewardInterrupted, RewardSignal, RewardTimeout, RewardTooSlow, deadline
from mixrl.rewards.protocol import ChecksAtStart, DenseCredit, Verified

RewardFn = Any


#: the largest reward magnitude accepted: TRL keeps rewards in float32 and squares their
#: deviations for the group std, which overflows to inf past sqrt(3.4e38) ~ 1.8e19
MAX_REWARD = 1e18


class CheckedReward:
    """A reward function that checks its own output: one finite number (or None, TRL's
    "not applicable") per completion. A raise or a wrong value becomes a one-line
    :class:`mixrl.errors.RewardError` naming the function and the row (the first failing
    row is found by re-calling the function one row at a time). Picklable when the wrapped
    function is; ``__name__`` is the wrapped function's (TRL names metrics after it)."""

    def __init__(self, fn: RewardFn, spec: str, timeout_s: float | None = None):
        self.fn = fn
        self.spec = spec
        self.timeout_s = timeout_s  # reward.timeout_s: wall-clock limit per call (mixrl.rewards.deadline)
        self.__name__ = getattr(fn, "__name__", None) or spec
        self.last_dense: dict[int, list[float]] = {}  # the last call's per-token rewards: row -> one float per token
        self.last_credit: dict[int, list[float]] = {}  # their per-token credit (algo.advantage.name=capo): the function's
        # own ``last_credit`` when it has one (reward=process: the steps' part, its outcome left out), else ``last_dense``
        if isinstance(fn, Verified):  # a reward scored by a model names the rule that decides "correct" (protocol.Verified)
            self.verifier = fn.verifier

    def check_at_start(self, policy_tokenizer: Any) -> None:
        """The start-up refusals of a reward that runs a model of its own (:class:`~mixrl.rewards.protocol.ChecksAtStart`):
        a model that is no sequence classifier, another tokenizer than the policy's (re-tokenised, said once, or refused)."""
        if isinstance(self.fn, ChecksAtStart):
            self.fn.check_model()
            self.fn.check_tokenizer(policy_tokenizer)

    def __call__(self, *args: Any, **kwargs: Any) -> list:
        prompts = kwargs.get("prompts", args[0] if args else None)
        completions = kwargs.get("completions", args[1] if len(args) > 1 else None)
        try:
            with deadline(self.timeout_s):
                out = self.fn(*args, **kwargs)
        except RewardTimeout:
            n = len(completions) if completions is not None else "?"
            raise RewardTooSlow(
                f"reward {self.spec!r} did not return within reward.timeout_s={self.timeout_s:g} s (a batch of {n} "
                "completions); make it faster or raise reward.timeout_s"
            ) from None
        except RewardSignal as e:
            raise RewardInterrupted(f"{e.args[0]} while reward {self.spec!r} was running") from None
        except MixrlUserError:  # already one line (e.g. a missing answer column)
            raise
        except Exception as e:  # noqa: BLE001 - the user's function: report it on one line
            row = self._failing_row(args, kwargs, completions)
            raise RewardError(
                f"reward {self.spec!r} raised {type(e).__name__}: {_first_line(e)}{self._where(row, prompts)}; "
                "fix the reward function"
            ) from e
        self.last_dense = {}
        if not isinstance(out, (str, bytes)) and hasattr(out, "__iter__") and any(isinstance(v, (list, tuple)) for v in out):
            out = self._split_dense(list(out), kwargs.get("completion_ids"), prompts)
        self.check(out, completions, prompts)
        credit = self.fn.last_credit if isinstance(self.fn, DenseCredit) else None  # the per-token part without its outcome (reward=process)
        self.last_credit = {i: list(credit[i]) for i in self.last_dense if i in credit} if isinstance(credit, dict) else dict(self.last_dense)
        return out

    def _split_dense(self, out: list, completion_ids: Any, prompts: Any) -> list:
        """Dense rows (a list of per-token rewards) -> their sum; the lists go to ``last_dense``."""
        summed = list(out)
        for i, v in enumerate(out):
            if not isinstance(v, (list, tuple)):
                continue
            if completion_ids is None or i >= len(completion_ids):
                raise RewardError(f"reward {self.spec!r} returned a list of per-token rewards{self._where(i, prompts)} but the "
                                  "trainer passed no completion_ids to check its length against")
            n = len(completion_ids[i])
            if len(v) != n:
                raise RewardError(
                    f"reward {self.spec!r} returned {len(v)} per-token rewards for a completion of {n} tokens"
                    f"{self._where(i, prompts)}; a dense reward gives one float per completion token")
            if any(x is None for x in v):
                raise RewardError(f"reward {self.spec!r} returned None inside a per-token reward list{self._where(i, prompts)}; "
                                  "use 0.0 for a token without reward (None skips a whole row)")
            self.check(list(v), None, prompts)  # every entry a finite number
            self.last_dense[i] = [float(x) for x in v]
            summed[i] = float(sum(self.last_dense[i]))
        return summed

    def check(self, out: Any, completions: Any, prompts: Any = None) -> None:
        """Raise RewardError unless ``out`` is one finite number or None per completion."""
        n = len(completions) if completions is not None else None
        if isinstance(out, (str, bytes)) or not hasattr(out, "__len__") or not hasattr(out, "__iter__"):
            raise RewardError(
                f"reward {self.spec!r} returned {type(out).__name__}, not a list; "
                "a reward returns one float per completion"
            )
        if n is not None and len(out) != n:
            raise RewardError(
                f"reward {self.spec!r} returned {len(out)} values for {n} completions; "
                "a reward returns one float per completion"
            )
        for i, v in enumerate(out):
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) and not _is_number(v):
                raise RewardError(
                    f"reward {self.spec!r} returned {type(v).__name__} {_short(v)}{self._where(i, prompts)}; "
                    "a reward must be a float (or None to skip the row)"
                )
            if not math.isfinite(float(v)):
                raise RewardError(
                    f"reward {self.spec!r} returned {float(v)}{self._where(i, prompts)}; "
                    "a reward must be a finite float (or None to skip the row)"
                )
            if abs(float(v)) > MAX_REWARD:
                raise RewardError(
                    f"reward {self.spec!r} returned {float(v):g}{self._where(i, prompts)}; rewards beyond +-{MAX_REWARD:g} "
                    "overflow the trainer's float32 group statistics (std, advantages); scale the reward down"
                )

    def _failing_row(self, args: tuple, kwargs: dict, completions: Any) -> int | None:
        if completions is None or len(completions) < 2:
            return 0 if completions is not None else None
        n = len(completions)
        for i in range(n):
            a = [_row(x, i, n) for x in args]
            kw = {k: _row(v, i, n) for k, v in kwargs.items()}
            try:
                self.fn(*a, **kw)
            except Exception:  # noqa: BLE001
                return i
        return None

    @staticmethod
    def _where(row: int | None, prompts: Any) -> str:
        if row is None:
            return ""
        text = ""
        if prompts is not None and row < len(prompts):
            p = prompts[row]
            if isinstance(p, list) and p and isinstance(p[-1], dict):
                p = p[-1].get("content", "")
            text = f" (prompt {_short(p)})"
        return f" on row {row}{text}"


def _row(value: Any, i: int, n: int) -> Any:
    """Row ``i`` of a per-row batch argument (a list of length n), else the value as is."""
    return [value[i]] if isinstance(value, list) and len(value) == n else value


def _is_number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return hasattr(v, "dtype")  # numpy / torch scalars


def _short(v: Any, width: int = 40) -> str:
    text = repr(v).replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
