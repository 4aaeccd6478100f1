"""Self-verification as a second task (RISE): the policy rates its own solutions, both tasks rewarded.

RISE ("Trust, But Verify: A Self-Verification Approach to Reinforcement Learning with Verifiable
Rewards", arXiv 2505.13445): in each step the policy solves (the rollouts, rewarded by the
verifier), then verifies some of its own solutions: for a solution y of x it is asked to rate y,
and the verification v is rewarded by whether its rating matches the verifier's score of y. The
verifications join the batch as rows of their own prompt (the verification request) and both
trajectories train the policy.

The authors' code (xyliu-cs/RISE @ 3837783eba9ab17c6ee2f3d5c6e37da013b4c5c6, its verl submodule
xyliu-cs/verl @ 2d78843440b7896edd15a6fb7c524178664c6cf3): ``verl/trainer/ppo/ray_trainer.py``
lines 1035-1090 take ``critique_batch_size`` solutions spread evenly over the groups
(``DataProto.downsampling``, verl/protocol.py:648-700: ``total // groups`` per group, the remainder
to the first groups, drawn at random), build the verification prompt from the question and the
solution (``verl/utils/critique_utils.py``: CRITIQUE_PROMPT, "assign \\boxed{1} / \\boxed{-0.5} /
\\boxed{-1}"), sample ``rollout.n`` verifications of each, reward them by
``verl_utils/reward/reward_func_verification.py`` (no rating: -1; the rating equals the
solution's score: 1; else -0.5; the "ground truth" is the solution's score, critique_utils.py
lines 185-205) and concatenate them with the solutions into one PPO batch.

Here: ``solutions`` solutions per step (all processes), ``verifications`` per solution through the
policy's handle (:class:`mixrl.trainer.parts.policy_calls.PolicyCalls`: the rollouts' generation
path, behaviour log-probs recorded), the rating read after ``marker``; the verifications are
appended after the advantages (provenance ``verification``, behaviour stored) with a GRPO
advantage over the verifications of one solution, A = (r - mean) / (std + 1e-6). The authors' run
is PPO with a learned critic (GAE over both tasks); mixrl's learned critic values rows before an
injection appends any, so the appended verifications take the group-relative advantage.
"""

from __future__ import annotations

import random

import torch

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.rewards.extract import extract_after_marker
from mixrl.sources.base import INJECTIONS, InjectContext, Injection, check_template, template_text
from mixrl.sources.rows import append_rows
from mixrl.sources.self_hint import in_last_user

VERIFICATION = prov.register_provenance(
    "verification", behaviour="stored",
    description="the policy's rating of one of its own solutions (RISE's second task), trained under the verification "
                "request (behaviour log-prob recorded when it was written)",
).code

#: the verification request, after RISE's CRITIQUE_PROMPT (the rating after the answer marker instead of \\boxed{})
REQUEST = ("Below are a question and a tentative solution. Verify the solution and rate it: 1 if it is correct, "
           "-0.5 if its final answer is wrong, -1 if it has no final answer. Write the rating after ####.\n"
           "Question: {prompt}\nSolution: {solution}\nVerification:")


def verification_reward(text: str, score: float, marker: str, right: float, wrong: float, missing: float) -> float:
    """RISE's verification reward: ``missing`` when no rating follows ``marker``, ``right`` when
    the rating equals the solution's ``score``, else ``wrong``."""
    got = extract_after_marker(text, marker)
    try:
        rating = float(got.split()[0]) if got else None
    except ValueError:
        rating = None
    if rating is None:
        return missing
    return right if abs(rating - float(score)) < 1e-6 else wrong


def spread(groups: list[list[int]], k: int, rng: random.Random) -> list[int]:
    """``k`` rows drawn from ``groups`` as the authors' downsampling: ``k // len(groups)`` from each,
    one more from each of the first ``k % len(groups)``, at random within a group, in order."""
    if not groups:
        return []
    base, extra = divmod(k, len(groups))
    picks = []
    for g, rows in enumerate(groups):
        n = min(len(rows), base + (1 if g < extra else 0))
        picks += sorted(rng.sample(rows, n))
    return picks


@INJECTIONS.register("self_verify", bounds={
    "solutions": (">= 1", "solutions verified per step, all processes"),
    "verifications": (">= 1", "verifications of each solution (one group)"),
    "verify_tokens": (">= 1", "tokens"),
})
class SelfVerify(Injection):
    """RISE: the policy verifies its own solutions as a second task; both are trained.

    After the advantages, ``solutions`` rollouts per step (spread evenly over the groups) are each
    verified ``verifications`` times by the policy from ``request``; a verification's reward is
    ``right`` when the rating after ``marker`` equals the solution's first reward, ``wrong`` when
    it differs, ``missing`` without one; it is appended as a row of the request (provenance
    ``verification``) with the GRPO advantage over its solution's verifications.

    Formula: for K = {solutions} rollouts y of x: v_j ~ pi_old(. | V(x, y)), j = 1..{verifications}; r(v_j) = {right} if rating(v_j) = R(x, y), {wrong} if not, {missing} without a rating; A_j = (r_j - mean_j r) / (std_j r + 1e-6); rows (V(x, y), v_j) trained beside the rollouts
    Paper: RISE, "Trust, But Verify: A Self-Verification Approach to Reinforcement Learning with Verifiable Rewards" (arXiv 2505.13445).

    Parameters:
        solutions (16): solutions verified per step, all processes (RISE: critique_batch_size 128 of 1024 prompts).
        verifications (4): verifications sampled per solution, one group (RISE: rollout.n, 8).
        request (REQUEST): the verification request ({prompt}, {solution}); the default: RISE's rating criteria shortened, the rating after ####, "Question:", "Solution:", "Verification:".
        marker ("####"): the rating follows it (RISE: \\boxed{}).
        verify_tokens (None): the longest verification (null: trainer.max_completion_length).
        right (1.0): reward of a verification whose rating equals the solution's reward.
        wrong (-0.5): reward of one whose rating differs.
        missing (-1.0): reward of one without a rating.
    """

    needs_source = False
    appends_rows_after_advantages = True
    may_generate_more = True
    provenances = ("verification",)

    def __init__(self, *, solutions: int = 16, verifications: int = 4, request: str = REQUEST, marker: str = "####",
                 verify_tokens: int | None = None, right: float = 1.0, wrong: float = -0.5, missing: float = -1.0,
                 source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        check_template(request, ("prompt", "solution"), "algo.inject.request", REQUEST)
        if "{solution}" not in request:
            raise ConfigError("algo.inject.request must contain {solution} (the solution verified), e.g. "
                              "'{prompt}\\nSolution: {solution}\\nRating:'")
        self.solutions, self.verifications = int(solutions), int(verifications)
        if geometry is not None:
            W, unit = geometry.world_size, geometry.world_size * geometry.grad_accum
            if self.solutions % W or (self.solutions // W * self.verifications) % geometry.grad_accum:
                raise ConfigError(
                    f"algo.inject.solutions={solutions} x verifications={verifications} must give every process "
                    f"the same whole number of solutions and every micro-batch the same number of rows "
                    f"({W} process(es) x {geometry.grad_accum} micro-batch(es) = {unit}); e.g. solutions={unit}")
            if self.solutions > geometry.rollouts_per_step:
                raise ConfigError(f"algo.inject.solutions={solutions} is more than the {geometry.rollouts_per_step} "
                                  "rollouts per step; lower it")
        self.request, self.marker, self.verify_tokens = request, marker, verify_tokens
        self.right, self.wrong, self.missing = float(right), float(wrong), float(missing)
        self._primary: torch.Tensor | None = None
        self.metrics: dict[str, float] = {}

    def texts(self) -> list[str]:
        return [template_text(self.request)]

    def extra_rows_per_step(self, rollouts_per_step: int, unit: int) -> int:
        return self.solutions * self.verifications

    def after_rewards(self, ctx: InjectContext, inputs: list[dict], rewards: torch.Tensor) -> torch.Tensor:
        self._primary = ctx.primary_rewards  # the verifier's score of every solution (global rows), kept for the ratings
        return rewards

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        if (self.verify_tokens or 0) > ctx.max_completion_length:  # the verifications are trained completions
            raise ConfigError(f"algo.inject.verify_tokens={self.verify_tokens} is more than trainer.max_completion_length="
                              f"{ctx.max_completion_length}: the verifications are trained rows and must fit the completion "
                              "budget; lower algo.inject.verify_tokens or raise trainer.max_completion_length")
        n, G = len(inputs), ctx.num_generations
        start = ctx.process_index * n
        score = torch.nan_to_num(self._primary[start:start + n].float(), nan=0.0).tolist()
        groups: dict[int, list[int]] = {}
        for i in range(n):
            if int(out["row_source"][i]) == prov.ON_POLICY:
                groups.setdefault((start + i) // G, []).append(i)
        rng = random.Random(hash((self.seed, ctx.process_index, ctx.global_step, ctx.micro_step)))
        picks = spread(list(groups.values()), self.solutions // ctx.num_processes, rng)
        calls = ctx.policy_calls("algo.inject.name='self_verify'")
        mask = out["completion_mask"].bool()
        requests = []
        for i in picks:
            text = ctx.tokenizer.decode(out["completion_ids"][i][mask[i]].tolist(), skip_special_tokens=True)
            requests += [in_last_user(inputs[i]["prompt"], self.request, solution=text)] * self.verifications
        written = calls.write_all(requests, max_new_tokens=self.verify_tokens or ctx.max_completion_length)
        calls.sync(ctx.gather, device=ctx.device)
        rewards = torch.tensor([verification_reward(w.text, score[picks[j // self.verifications]], self.marker,
                                                    self.right, self.wrong, self.missing) for j, w in enumerate(written)])
        V = self.verifications
        adv = group_advantages(rewards, V) if len(written) else rewards
        self._log(ctx, rewards, picks, score)
        if not written:
            return out
        return append_rows(out, [w.context_ids for w in written], [w.ids for w in written],
                           pad_id=ctx.tokenizer.pad_token_id,
                           row_source=torch.full((len(written),), VERIFICATION, dtype=torch.long),
                           behaviour_logp=[w.behaviour_logp for w in written],
                           advantages=adv.to(out["advantages"].dtype))

    def _log(self, ctx: InjectContext, rewards: torch.Tensor, picks: list[int], score: list[float]) -> None:
        """verify/reward (mean reward of the verifications), verify/right, verify/missing (shares)."""
        if not len(rewards):
            return
        self.metrics = {"verify/reward": float(rewards.mean()),
                        "verify/right": float((rewards == self.right).float().mean()),
                        "verify/missing": float((rewards == self.missing).float().mean()),
                        "verify/solutions_correct": sum(score[i] >= 1.0 for i in picks) / max(len(picks), 1)}


def group_advantages(rewards: torch.Tensor, size: int) -> torch.Tensor:
    """GRPO's advantage over consecutive groups of ``size``: (r - mean) / (std + 1e-6), unbiased std
    (one row: 0)."""
    r = rewards.view(-1, size).float()
    std = r.std(dim=1, keepdim=True) if size > 1 else torch.zeros_like(r[:, :1])
    return ((r - r.mean(dim=1, keepdim=True)) / (std + 1e-6)).flatten()
