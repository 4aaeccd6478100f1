"""Reward registry and ``build_reward``.

A reward is a TRL reward function ``fn(prompts, completions, **kwargs) -> list[float | None]``:
``kwargs`` carry the dataset columns (``answer=[...]``) plus TRL extras (``trainer_state``, ...).

``REWARDS`` maps a name to a *factory*: a function with keyword-only parameters that returns
a reward function. ``build_reward`` accepts a registered name or a dotted import path to
the user's own function or factory (``my_pkg.rewards:fn``, ``my_pkg.rewards.fn`` or
``path/to/rewards.py:fn``).

**Dense rewards.** Instead of a float, a reward may return for a completion a *list of floats*,
one per completion token (the length of that row's ``completion_ids`` argument): a per-token
(process, or teacher) reward. :class:`CheckedReward` checks the length, hands the trainer the
row's sum as its outcome reward (what ``grpo`` and the other group advantages see), and keeps
the list in ``last_dense`` ({row: list}) for the trainer: with ``algo.advantage.name=gae`` each
token's reward enters GAE (weighted by the reward's weight); with ``algo.advantage.name=capo`` the
per-token credit (``last_credit``: the function's own ``last_credit`` if it keeps one, else the list)
gives each token its own advantage (:mod:`mixrl.core.process_advantages`); otherwise only the sum is used.
A per-step reward is written as a list with the step's reward on the step's last token and
zeros elsewhere.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mixrl.errors import ConfigError, did_you_mean
from mixrl.registry import Registry
from mixrl.rewards.checked import MAX_REWARD, CheckedReward, _first_line  # noqa: F401  (CheckedReward, MAX_REWARD: their home before)
from mixrl.rewards.protocol import CONTEXT_PARAM, RewardContext

__all__ = ["REWARDS", "RewardFn", "register_reward", "build_reward", "reward_params"]

RewardFn = Callable[..., list]

#: name -> factory(**params) -> reward function (the one registry type: a taken name is refused)
REWARDS = Registry("reward", runtime=(CONTEXT_PARAM,))


def register_reward(name: str) -> Callable[[Callable[..., RewardFn]], Callable[..., RewardFn]]:
    """Decorator: register ``factory`` under ``name`` (a factory takes keyword-only params); a name
    taken by another factory is refused (``ValueError``, one line)."""
    return REWARDS.register(name)


def reward_params(factory: Callable) -> dict[str, Any]:
    """The config parameters a factory accepts, with their defaults (``inspect.Parameter.empty`` if required);
    ``context`` (the run's :class:`~mixrl.rewards.protocol.RewardContext`) is not one."""
    sig = inspect.signature(factory)
    return {
        p.name: p.default
        for p in sig.parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != CONTEXT_PARAM
    }


def _is_dotted(name: str) -> bool:
    return ":" in name or "." in name or name.endswith(".py")


def build_reward(name_or_path: str, *, context: RewardContext | None = None, **params: Any) -> RewardFn:
    """Return the reward function for a registered name or a dotted import path.

    ``context``: what the run gives its rewards (:class:`~mixrl.rewards.protocol.RewardContext`): a
    factory declaring a ``context`` parameter receives it, and ``context.timeout_s`` bounds each call.

    * registered name (``exact``, ``math``): ``REWARDS[name](**params)``;
    * dotted path to a *factory* (a class, or a function without a ``completions`` parameter):
      called with ``params``, and must return the reward function;
    * dotted path to a reward function (it has a ``completions`` parameter): used as is;
      ``params`` must then be empty.

    Raises ``ConfigError`` (one line, with the fix) for unknown names, unimportable paths and bad params.
    The built-ins are registered by the package: importing this module runs ``mixrl/rewards/__init__.py``,
    which imports :mod:`mixrl.rewards.builtin`.
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ConfigError(
            f"reward name must be a non-empty string, got {name_or_path!r}; "
            f"set reward.name to one of: {', '.join(sorted(REWARDS))}, or a dotted path like my_pkg.rewards:my_reward"
        )
    name = name_or_path.strip()
    if context is not None and not isinstance(context, RewardContext):
        raise ConfigError(f"reward {name!r}: 'context' is not a reward param (the run's context is given to the reward); "
                          "remove reward.params.context")
    timeout_s = context.timeout_s if context is not None else None
    if name in REWARDS:
        return CheckedReward(_call_factory(name, REWARDS[name], params, context), name, timeout_s)
    if not _is_dotted(name):
        raise ConfigError(
            f"unknown reward {name!r}{did_you_mean(name, REWARDS)}; built-in rewards: {', '.join(sorted(REWARDS))}; "
            "for your own function set reward.name to its import path, e.g. my_pkg.rewards:my_reward "
            "or path/to/rewards.py:my_reward"
        )
    obj = _import_object(name)
    if _is_factory(obj):
        return CheckedReward(_call_factory(name, obj, params, context), name, timeout_s)
    if params:
        raise ConfigError(
            f"reward {name!r} is a plain reward function, so it takes no params, but got: {', '.join(sorted(params))}; "
            "remove reward.params, or make it a factory (a function without a 'completions' argument, "
            "taking the params and returning the reward function)"
        )
    return CheckedReward(_ensure_name(obj, name), name, timeout_s)


def _is_factory(obj: Any) -> bool:
    """A class, or a callable with no ``completions`` parameter (and no ``*args`` catching it)."""
    if inspect.isclass(obj):
        return True
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return False
    names = set(sig.parameters)
    if "completions" in names or "completion" in names:
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values()):
        return False  # fn(*args, **kwargs): can take (prompts, completions)
    return True


def _call_factory(name: str, factory: Callable, params: dict[str, Any], context: RewardContext | None = None) -> RewardFn:
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        accepted = reward_params(factory)
        takes_var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        if not takes_var_kw:
            unknown = [k for k in params if k not in accepted]
            if unknown:
                hint = did_you_mean(unknown[0], accepted)
                valid = ", ".join(accepted) or "(none)"
                raise ConfigError(
                    f"reward {name!r} got unknown param {unknown[0]!r}{hint}; valid params: {valid}; fix reward.params"
                )
        missing = [k for k, d in accepted.items() if d is inspect.Parameter.empty and k not in params]
        if missing:
            raise ConfigError(f"reward {name!r} needs param(s) {', '.join(missing)}; set them under reward.params")
    given = {CONTEXT_PARAM: context} if sig is not None and CONTEXT_PARAM in sig.parameters else {}  # the factory declares it takes the run's context
    try:
        fn = factory(**params, **given)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"reward {name!r} rejected its params ({msg}); fix reward.params") from e
    if not callable(fn):
        raise ConfigError(
            f"reward factory {name!r} returned {type(fn).__name__}, not a function; "
            "a factory must return fn(prompts, completions, **kwargs) -> list[float]"
        )
    return _ensure_name(fn, name)


def _ensure_name(fn: Any, name: str) -> RewardFn:
    """TRL names reward metrics after ``fn.__name__``; give callable objects one."""
    if not callable(fn):
        raise ConfigError(
            f"reward {name!r} is a {type(fn).__name__}, not a function; point reward.name at a reward function or factory"
        )
    if not hasattr(fn, "__name__") and not hasattr(fn, "func"):  # functools.partial is named by TRL
        short = name.replace(":", ".").rsplit(".", 1)[-1]
        try:
            fn.__name__ = short
        except (AttributeError, TypeError):
            pass
    return fn


# ----------------------------------------------------------------------------- import


def _load_file_module(path: str, spec_text: str) -> Any:
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"reward {spec_text!r}: file {str(file)!r} not found; fix the path in reward.name")
    mod_name = f"mixrl_user_rewards.{file.stem}"
    if mod_name in sys.modules and getattr(sys.modules[mod_name], "__file__", None) == str(file.resolve()):
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, file.resolve())
    if spec is None or spec.loader is None:
        raise ConfigError(f"reward {spec_text!r}: cannot import {str(file)!r} as a Python module; use a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # so that the reward pickles
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - report the user's module error on one line
        del sys.modules[mod_name]
        raise ConfigError(
            f"reward {spec_text!r}: importing {str(file)!r} failed ({type(e).__name__}: {_first_line(e)}); fix that file"
        ) from e
    return module


def _import_module(module: str, spec_text: str) -> Any:
    """Import ``module``; return None if it (or a parent package) does not exist."""
    for attempt in range(2):
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as e:
            missing = e.name or ""
            if not (module == missing or module.startswith(missing + ".")):
                # the module exists but one of *its* imports is missing
                raise ConfigError(
                    f"reward {spec_text!r}: module {module!r} could not be imported ({_first_line(e)}); "
                    "install the missing package"
                ) from e
            cwd = os.getcwd()
            if attempt == 0 and cwd not in sys.path and "" not in sys.path:
                sys.path.append(cwd)  # console scripts do not search the working directory
                importlib.invalidate_caches()
                continue
            return None
        except Exception as e:  # noqa: BLE001
            raise ConfigError(
                f"reward {spec_text!r}: importing module {module!r} failed ({type(e).__name__}: {_first_line(e)}); "
                "fix that module"
            ) from e
    return None


def _get_attr_path(obj: Any, attrs: list[str], module_name: str, spec_text: str) -> Any:
    for attr in attrs:
        if not hasattr(obj, attr):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise ConfigError(
                f"reward {spec_text!r}: {module_name!r} has no attribute {attr!r}{did_you_mean(attr, names)}; "
                "check the name after the module in reward.name"
            )
        obj = getattr(obj, attr)
        module_name = f"{module_name}.{attr}"
    return obj


def _import_object(spec_text: str) -> Any:
    """Resolve ``pkg.mod:attr``, ``pkg.mod.attr`` or ``path/to/file.py:attr``."""
    if ":" in spec_text:
        module_part, _, attr_part = spec_text.rpartition(":")
        if not module_part or not attr_part:
            raise ConfigError(
                f"reward {spec_text!r} is not a valid import path; write it as my_pkg.rewards:my_reward"
            )
        attrs = attr_part.split(".")
        if module_part.endswith(".py") or "/" in module_part or os.sep in module_part:
            module = _load_file_module(module_part, spec_text)
            return _get_attr_path(module, attrs, module_part, spec_text)
        module = _import_module(module_part, spec_text)
        if module is None:
            raise ConfigError(
                f"reward {spec_text!r}: module {module_part!r} could not be imported (not found); "
                "install it or put it on PYTHONPATH (the working directory is searched too)"
            )
        return _get_attr_path(module, attrs, module_part, spec_text)

    parts = spec_text.split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(
            f"reward {spec_text!r} is not a valid import path; write it as my_pkg.rewards:my_reward"
        )
    # the longest importable prefix is the module, the rest are attributes
    for i in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:i])
        module = _import_module(module_name, spec_text)
        if module is not None:
            return _get_attr_path(module, parts[i:], module_name, spec_text)
    raise ConfigError(
        f"reward {spec_text!r}: module {'.'.join(parts[:-1])!r} could not be imported (not found); "
        "install it or put it on PYTHONPATH (the working directory is searched too), "
        f"or use a built-in reward: {', '.join(sorted(REWARDS))}"
    )
