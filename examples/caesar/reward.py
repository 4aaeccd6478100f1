"""Reward of the Caesar-shift example: 1 when the completion is exactly the shifted word.

    mixrl train ... reward.name=examples/caesar/reward.py:shifted
"""


def shifted(prompts, completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
