"""Evaluation: a model's accuracy and pass@k on held-out rows, during training and after it.

* :mod:`~mixrl.evaluation.accuracy`: greedy accuracy per level and sampled pass@k (the unbiased
  estimator of "Evaluating Large Language Models Trained on Code") of a model on rows;
* :mod:`~mixrl.evaluation.greedy`: greedy accuracy per level of a plain-text built-in task;
* :mod:`~mixrl.evaluation.builtin_models`: the held-out accuracy of the built-in BPE models (what
  ``python -m mixrl.cli.ship_models --eval N`` records in the shipped manifest);
* :mod:`~mixrl.evaluation.heldout`: the held-out rows are never training rows (the split rule);
* :mod:`~mixrl.evaluation.periodic`: the callback that evaluates every ``trainer.eval_every``
  steps (``eval.jsonl``);
* :mod:`~mixrl.evaluation.saved`: a saved model folder (full, or a LoRA adapter on its base);
* :mod:`~mixrl.evaluation.cache`: the starting model's evaluation shared by a grid's runs.

This package reads configs only through their fields (never ``mixrl.config``) and never imports
the trainer: the trainer calls it. ``mixrl eval`` (a saved model on its run's held-out split,
which needs the trainer's reward and tokenizer assembly) is :mod:`mixrl.trainer.saved_eval`.
"""
