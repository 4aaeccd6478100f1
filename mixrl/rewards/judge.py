"""``reward=judge``: a generative judge reads a prompt built from a template and writes a verdict,
which a parser turns into the reward.

Backends (``backend``):

* ``endpoint``: an OpenAI-compatible server at ``url`` (``.../v1`` or the full ``.../chat/completions``),
  asked with the chat-completions JSON (``{"model", "messages", "temperature", "max_tokens"}``; the verdict
  is ``choices[0].message.content``). A refused connection, a timeout, HTTP 429 or 5xx is retried
  ``retries`` times with backoff ``backoff_s * 2^k``; then the run stops with one line
  (:class:`JudgeUnavailable`: the trainer saves a checkpoint of the last finished step, to continue with
  ``resume=``). The key, if any, is read from the environment variable ``api_key_env``.
* ``hf``: a causal LM of ``path`` run here with greedy ``generate`` (``path=policy``: a frozen copy of the
  run's own starting model, ``model.path``).

The parser: ``pattern`` (a regex, first group) is searched in the verdict; a number is divided by
``scale``, a word is looked up in ``labels`` (``correct``/``yes``: 1, ``incorrect``/``no``: 0). A verdict
with no match is *unparsable*, never a silent 0: it is counted (``judge/unparsable`` in the metrics, a
warning in the log with an example) and ``unparsable`` decides the row's reward: ``neutral`` (the value
``neutral``, default), ``drop`` (None: the row carries no reward) or ``error`` (stop). When the last
``give_up_after`` verdicts were all unparsable the run stops with one line naming the template and pattern.
Held-out accuracy is judged by ``verifier`` (``exact`` by default; ``none``: by the judge, a score of 1 counting as right).

Verdicts are cached per (judge, prompt, completion) in the process: a completion judged once is not asked again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mixrl.errors import ConfigError, RewardError
from mixrl.rewards.components import local_device, register_model_reward
from mixrl.rewards.deadline import RewardTooSlow
from mixrl.rewards.extract import completion_text
from mixrl.rewards.protocol import RewardContext
from mixrl.rewards.registry import build_reward

logger = logging.getLogger(__name__)

DEFAULT_TEMPLATE = ("Judge the answer to a problem.\nProblem: {prompt}\nAnswer: {completion}\nReference answer: {answer}\n"
                    "Reply with 'Score: N', N from 0 (wrong) to 10 (right).")
DEFAULT_PATTERN = r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)"
LABELS = {"correct": 1.0, "right": 1.0, "yes": 1.0, "incorrect": 0.0, "wrong": 0.0, "no": 0.0}
UNPARSABLE = ("neutral", "drop", "error")
BACKENDS = ("endpoint", "hf")


class JudgeUnavailable(RewardTooSlow):
    """The judge's endpoint did not answer after its retries (the one-line stop; the run stays resumable)."""


def parse_verdict(text: str, pattern: re.Pattern, scale: float, labels: dict[str, float]) -> float | None:
    """The reward a verdict states, or None if ``pattern`` does not find one."""
    m = pattern.search(text or "")
    if m is None:
        return None
    token = (m.group(1) if m.groups() else m.group(0)).strip()
    try:
        return float(token) / scale
    except ValueError:
        return labels.get(token.lower())


class _Fields(dict):
    def __missing__(self, key: str) -> str:
        return ""


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
    return "" if prompt is None else str(prompt)


class JudgeReward:
    """The picklable reward function of ``reward=judge``."""

    def __init__(self, *, backend: str, url: str | None, model: str, path: str | None, template: str, pattern: str,
                 scale: float, unparsable: str, neutral: float, give_up_after: int, retries: int, backoff_s: float,
                 timeout_s: float, temperature: float, max_tokens: int, concurrency: int, api_key_env: str,
                 answer_column: str, verifier: str, context: RewardContext | None = None):
        self.__name__ = "judge"
        self.verifier = None if verifier == "none" else build_reward(verifier, answer_column=answer_column)  # held-out accuracy
        self.follows_policy = path == "policy"  # path=policy: the run's starting model (the run's RewardContext), when given
        if self.follows_policy and context is not None and context.policy_path is not None:
            path = str(context.policy_path)
        self.backend, self.url, self.model, self.path = backend, url, model, path
        self.template, self.pattern_text, self.scale = template, pattern, scale
        self.unparsable, self.neutral, self.give_up_after = unparsable, neutral, give_up_after
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self.temperature, self.max_tokens, self.concurrency = temperature, max_tokens, concurrency
        self.api_key_env, self.answer_column = api_key_env, answer_column
        self.cache: dict[str, str] = {}
        self.unparsable_total = 0
        self.unparsable_run = 0  # unparsable verdicts since the last parsable one
        self._hf = None
        self.run_device = context.device if context is not None else None  # hardware.device: where a judge served by transformers loads

    def __getstate__(self):
        return {**self.__dict__, "_hf": None}

    def identity(self) -> str:
        return json.dumps([self.backend, self.url, self.model, self.path, self.template], sort_keys=True)

    # ------------------------------------------------------------------ asking
    def endpoint_url(self) -> str:
        url = str(self.url).rstrip("/")
        return url if url.endswith("/chat/completions") else url + "/chat/completions"

    def ask_endpoint(self, text: str) -> str:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": text}],
                           "temperature": self.temperature, "max_tokens": self.max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        reason = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                req = urllib.request.Request(self.endpoint_url(), data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    data = json.loads(resp.read().decode())
                return str(data["choices"][0]["message"]["content"] or "")
            except urllib.error.HTTPError as e:
                reason = f"HTTP {e.code}"
                if e.code != 429 and e.code < 500:
                    raise RewardError(f"judge endpoint {self.endpoint_url()} refused the request ({reason}); "
                                      "check reward.params.url and reward.params.model") from None
            except (urllib.error.URLError, OSError, TimeoutError) as e:
                reason = str(getattr(e, "reason", e)) or type(e).__name__
            except (KeyError, IndexError, TypeError, ValueError) as e:
                raise RewardError(f"judge endpoint {self.endpoint_url()} answered without choices[0].message.content "
                                  f"({type(e).__name__}); point reward.params.url at an OpenAI-compatible server") from None
        raise JudgeUnavailable(f"judge endpoint {self.endpoint_url()} did not answer after {self.retries + 1} tries ({reason}); "
                               "start it or fix reward.params.url")

    def ask_hf(self, texts: list[str], temperature: float = 0.0, strict_context: bool = False) -> list[str]:
        """The local judge's answers (greedy; sampled at ``temperature`` > 0: CAPO's votes). With
        ``strict_context``, a question that leaves no room for ``max_tokens`` in the judge's
        context is a one-line RewardError (the others run past it, as before)."""
        import torch  # deferred: config validation builds this reward
        from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: transformers, 1 s

        if self._hf is None:
            tok = AutoTokenizer.from_pretrained(self.path)
            tok.padding_side = "left"
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            device = local_device(self.run_device)
            self._hf = (AutoModelForCausalLM.from_pretrained(self.path, dtype="auto").to(device).eval(), tok)
        model, tok = self._hf
        enc = tok(texts, return_tensors="pt", padding=True).to(model.device)
        positions = getattr(model.config, "max_position_embeddings", None)
        if strict_context and positions and enc["input_ids"].shape[1] + self.max_tokens > positions:
            raise RewardError(f"the judge's question is {enc['input_ids'].shape[1]} tokens and its answer may be {self.max_tokens}: "
                              f"together over the judge's {positions} positions; shorten the template or max_tokens")
        sample = {"do_sample": True, "temperature": float(temperature)} if temperature > 0 else {"do_sample": False}
        with torch.no_grad():
            out = model.generate(**enc, **sample, max_new_tokens=self.max_tokens, pad_token_id=tok.pad_token_id)
        return tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)

    def verdicts(self, texts: list[str]) -> list[str]:
        """The judge's verdict on each prompt text (cached by text and judge)."""
        keys = [hashlib.sha256((self.identity() + "\0" + t).encode()).hexdigest() for t in texts]
        first: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k not in self.cache:
                first.setdefault(k, i)  # one question per distinct text
        todo = list(first.values())
        if todo:
            if self.backend == "endpoint":
                with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(todo)))) as pool:
                    answers = list(pool.map(self.ask_endpoint, [texts[i] for i in todo]))
            else:
                answers = self.ask_hf([texts[i] for i in todo])
            for i, a in zip(todo, answers):
                self.cache[keys[i]] = a
        return [self.cache[k] for k in keys]

    # ------------------------------------------------------------------ the reward
    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None, **kwargs: Any):
        completions = list(completions or [])
        prompts = list(prompts or [""] * len(completions))
        answers = kwargs.get(self.answer_column)
        if answers is None or isinstance(answers, str):
            answers = [answers or ""] * len(completions)
        texts = [self.template.format_map(_Fields(prompt=_prompt_text(p), completion=completion_text(c), answer=a or ""))
                 for p, c, a in zip(prompts, completions, answers)]
        return self.score_texts(texts, kwargs.get("log_metric"))

    def score_texts(self, texts: list[str], log: Any = None, prefix: str = "judge") -> list[float | None]:
        """The parsed reward of the judge's verdict on each question text (unparsable: by ``unparsable``, counted)."""
        verdicts = self.verdicts(texts)
        pattern = re.compile(self.pattern_text)
        out: list[float | None] = []
        bad: list[str] = []
        for v in verdicts:
            r = parse_verdict(v, pattern, self.scale, LABELS)
            if r is None:
                bad.append(v)
                self.unparsable_run += 1
                out.append(self.neutral if self.unparsable == "neutral" else None)
            else:
                self.unparsable_run = 0
                out.append(r)
        if callable(log) and verdicts:
            log(f"{prefix}/unparsable", float(len(bad)))
            log(f"{prefix}/unparsable_frac", len(bad) / len(verdicts))
        if bad:
            self.unparsable_total += len(bad)
            example = bad[0].replace("\n", " ")[:80]
            if self.unparsable == "error":
                raise RewardError(f"judge returned {len(bad)} unparsable verdict(s) (e.g. {example!r}) and "
                                  "reward.params.unparsable=error; fix reward.params.template or reward.params.pattern")
            logger.warning("judge: %d of %d verdicts unparsable (%d in all; given %s): e.g. %r", len(bad), len(verdicts),
                           self.unparsable_total, "the neutral reward" if self.unparsable == "neutral" else "no reward", example)
            if self.give_up_after and self.unparsable_run >= self.give_up_after:
                raise RewardError(f"judge returned no parsable verdict in the last {self.unparsable_run} completions (e.g. "
                                  f"{example!r}, pattern {self.pattern_text!r}); fix reward.params.template or "
                                  "reward.params.pattern, or raise reward.params.give_up_after")
        return out


@register_model_reward("judge", bounds={"retries": ">= 0", "backoff_s": ">= 0", "timeout_s": "> 0", "give_up_after": ">= 0",
                                        "concurrency": ">= 1", "max_tokens": ">= 1"})
def judge_reward(*, backend: str | None = None, url: str | None = None, model: str = "judge", path: str | None = None,
                 template: str = DEFAULT_TEMPLATE, pattern: str = DEFAULT_PATTERN, scale: float = 10.0,
                 unparsable: str = "neutral", neutral: float = 0.0, give_up_after: int = 256, retries: int = 3,
                 backoff_s: float = 1.0, timeout_s: float = 60.0, temperature: float = 0.0, max_tokens: int = 64,
                 concurrency: int = 8, api_key_env: str = "OPENAI_API_KEY", answer_column: str = "answer",
                 verifier: str = "exact", context: RewardContext | None = None) -> JudgeReward:
    """A generative judge (an OpenAI-compatible endpoint, or a local model) scores each completion from a templated question.

    The template's ``{prompt}``, ``{completion}`` and ``{answer}`` are filled per row; the verdict's first
    match of ``pattern`` is the score (a number divided by ``scale``, or a label: correct/yes 1,
    incorrect/no 0). An unparsable verdict is counted and gets the ``neutral`` reward (or none, or stops
    the run: ``unparsable``); verdicts are cached per (judge, prompt, completion).

    Formula: r_i = parse(J(template(prompt_i, completion_i, answer_i))) / {scale}; unparsable: r_i = {neutral} (unparsable={unparsable})

    Paper: "Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena" (Zheng et al. 2023, arXiv 2306.05685): a strong LLM's graded verdict as the score of an answer.

    Parameters:
        backend (str | None): endpoint (an OpenAI-compatible server at url) or hf (a local causal LM at path);
            null: endpoint when url is set, else hf with path (default policy: the run runs offline).
        url (str | None): the server, e.g. http://localhost:8000/v1 (or the full .../chat/completions).
        model (str): the model name sent to the endpoint.
        path (str | None): backend=hf: a folder, a hub id, or policy (the run's starting model).
        template (str): the question; {prompt}, {completion} and {answer} are filled per row.
        pattern (str): the regex whose first group is the verdict (a number, or a label such as correct).
        scale (float): a numeric verdict is divided by it.
        unparsable (str): neutral (the neutral reward), drop (no reward) or error (stop the run).
        neutral (float): the reward of an unparsable verdict.
        give_up_after (int): stop when this many verdicts in a row were unparsable; 0 never.
        retries (int): endpoint tries after the first, with backoff backoff_s * 2^k, then a one-line stop.
        backoff_s (float): the first retry's wait, in seconds.
        timeout_s (float): one request's time limit, in seconds.
        temperature (float): the judge's sampling temperature.
        max_tokens (int): the verdict's length limit.
        concurrency (int): endpoint requests in flight.
        api_key_env (str): the environment variable holding the endpoint's key (sent as a Bearer token if set).
        answer_column (str): the dataset column filled into {answer}.
        verifier (str): what judges held-out accuracy: exact, math, or none (the judge itself).
    """
    if backend is None:  # the endpoint when one is named, else a local judge (the run's starting model by default)
        backend = "endpoint" if url else "hf"
        path = path or (None if url else "policy")
    if backend not in BACKENDS:
        raise ConfigError(f"reward 'judge': backend={backend!r} is not one of {', '.join(BACKENDS)}; fix reward.params.backend")
    if backend == "endpoint" and not url:
        raise ConfigError("reward 'judge': backend=endpoint needs reward.params.url (an OpenAI-compatible server, "
                          "e.g. http://localhost:8000/v1)")
    if backend == "hf" and not path:
        raise ConfigError("reward 'judge': backend=hf needs reward.params.path (a model folder, a hub id, or policy)")
    if unparsable not in UNPARSABLE:
        raise ConfigError(f"reward 'judge': unparsable={unparsable!r} is not one of {', '.join(UNPARSABLE)}; "
                          "fix reward.params.unparsable")
    try:
        re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"reward 'judge': pattern {pattern!r} is not a regular expression ({e}); fix reward.params.pattern") from None
    if "{completion}" not in template and "{step}" not in template:
        raise ConfigError("reward 'judge': the template has no {completion} field, so the judge would never see the "
                          "completion; add {completion} to reward.params.template")
    if verifier != "none" and verifier not in ("exact", "math"):
        raise ConfigError(f"reward 'judge': verifier={verifier!r} (what judges held-out accuracy) is not one of exact, math, none; "
                          "fix reward.params.verifier")
    if not float(scale) > 0:
        raise ConfigError(f"reward 'judge': scale={scale} must be > 0; fix reward.params.scale")
    return JudgeReward(backend=backend, url=url, model=model, path=path, template=template, pattern=pattern,
                       scale=float(scale), unparsable=unparsable, neutral=float(neutral), give_up_after=int(give_up_after),
                       retries=int(retries), backoff_s=float(backoff_s), timeout_s=float(timeout_s),
                       temperature=float(temperature), max_tokens=int(max_tokens), concurrency=int(concurrency),
                       api_key_env=api_key_env, answer_column=answer_column, verifier=verifier, context=context)
