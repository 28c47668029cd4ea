"""The study: the loop that asks Optuna and tells it, the rules for judging trials, their records and
storage, samplers, pruning, the settings never to launch again, re-measurement and ablation."""
