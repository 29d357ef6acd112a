"""The built-in RLVR trainer: ``train(config)`` / ``resume(run_dir)``.

- ``step``: one training step as named phases, top to bottom (read this first).
- ``collect``: sample + score + dynamic-sampling refill.  ``logprob_pass``: old/reference/update log-prob passes.
- ``update``: ppo_epochs x mini-batches x micro-batches of the registry loss.  ``schedule``: LR schedule.
- ``evaluation``: held-out accuracy during training.  ``trainer``: set-up, the loop, checkpoints, clean-up.
- ``plan``: which passes every step runs, decided once.  ``parts``: what a step is handed.
- ``run_dir``: ``train`` / ``resume`` and the run directory.  ``summary``: a finished run's headline numbers.
"""

_HOMES = {
    "EVAL_BEFORE": "trainer",
    "TrainResult": "trainer",
    "Trainer": "trainer",
    "TrainingStopped": "trainer",
    "make_run_dir": "run_dir",
    "resume": "run_dir",
    "train": "run_dir",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    # Lazy: importing one phase module (tests, tools) does not pull in the whole trainer and the model stack.
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f"tepo.training.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'tepo.training' has no attribute {name!r}")
