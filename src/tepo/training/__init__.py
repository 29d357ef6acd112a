"""The built-in RLVR trainer: ``train(config)`` / ``resume(run_dir)``.

- ``step``: one training step as named phases, top to bottom (read this first).
- ``collect``: sample + score + dynamic-sampling refill.  ``logprob_pass``: old/reference/update log-prob passes.
- ``update``: ppo_epochs x mini-batches x micro-batches of the registry loss.  ``schedule``: LR schedule.
- ``evaluation``: held-out accuracy during training.  ``trainer``: set-up, the loop, checkpoints, clean-up.
"""

__all__ = ["EVAL_BEFORE", "TrainResult", "Trainer", "TrainingStopped", "make_run_dir", "resume", "train"]


def __getattr__(name: str):
    # Lazy: importing one phase module (tests, tools) does not pull in the whole trainer and the model stack.
    if name in __all__:
        from tepo.training import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'tepo.training' has no attribute {name!r}")
