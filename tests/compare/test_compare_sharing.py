"""Which runs of a comparison share one initial held-out evaluation (eval_before.json), decided by the planner
without training; and interrupted runs without any checkpoint (train.save_every=0) restart."""

from __future__ import annotations

import json
from pathlib import Path

from tepo.compare.planning import flat_config, plan_comparison
from tepo.compare.record import run_state
from tepo.compare.runner import run_comparison
from tepo.compare.sharing import _NOT_EVAL_KEYS, eval_sharing_key
from tepo.config import RunConfig, load_config, save_config


def test_not_eval_keys_are_real_config_keys():
    # A renamed key (train.keep_checkpoints -> train.keep_last) must not linger here unnoticed.
    assert set(flat_config(RunConfig())) >= _NOT_EVAL_KEYS
    assert {
        "train.keep_last",
        "train.save_final",
        "rollout.async_steps",
        "reward.overlong_filter",
    } <= _NOT_EVAL_KEYS


def test_training_only_keys_do_not_change_the_key_eval_keys_do():
    base = load_config("compare_default")
    same = [
        "train.keep_last=5",
        "train.save_every=0",
        "train.save_optimizer=false",
        "rollout.async_steps=1",
        "reward.overlong_buffer=4",
        "eval.every=2",
        "algorithm.kl_coef=0.01",
    ]
    for item in same:
        assert eval_sharing_key(load_config("compare_default", [item])) == eval_sharing_key(base), item
    for item in ("eval.temperature=0.5", "eval.size=8", "model.name=other/model", "train.seed=1"):
        assert eval_sharing_key(load_config("compare_default", [item])) != eval_sharing_key(base), item


def _held_out_file(tmp_path: Path) -> str:
    path = tmp_path / "held_out.jsonl"
    path.write_text(
        "".join(json.dumps({"problem": f"{i} + 1 = ?", "answer": str(i + 1)}) + "\n" for i in range(8))
    )
    return str(path)


def _who_evaluated(plan) -> list[tuple[str, int]]:
    """Run the plan with a stand-in trainer that scores the initial policy only when eval_before.json is absent
    (as the trainer does) and records which runs had to."""
    evaluated = []

    def train(config, run_dir):
        if not (run_dir / "eval_before.json").exists():
            evaluated.append((config.algorithm.loss, config.train.seed))
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "eval_before.json").write_text(json.dumps({"eval_greedy_accuracy": 0.25}))

    run_comparison(plan, train_fn=train, resume_fn=lambda run_dir: None, log=lambda *a: None)
    return evaluated


def test_procedural_task_held_out_set_is_one_draw_for_every_seed(tmp_path):
    # tepo compare draws a procedural task's held-out set with one eval.seed for every run: the same problems
    # whatever train.seed, so a greedy-only evaluation of the initial policy is made once.
    plan = plan_comparison(tmp_path, ["grpo", "tepo"], [0, 1], overrides=["train.steps=2", "eval.samples=0"])
    assert {run.config.eval.seed for run in plan.runs} == {0}
    assert len({run.held_out_digest for run in plan.runs}) == 1
    assert _who_evaluated(plan) == [("grpo", 0)]


def test_procedural_task_without_an_eval_seed_shares_within_a_seed_only(tmp_path):
    # eval.seed null (--eval-seed none): each train.seed draws its own held-out set, one evaluation per seed.
    plan = plan_comparison(
        tmp_path, ["grpo", "tepo"], [0, 1], overrides=["train.steps=2", "eval.samples=0"], eval_seed=None
    )
    assert len({run.held_out_digest for run in plan.runs}) == 2
    assert _who_evaluated(plan) == [("grpo", 0), ("grpo", 1)]


def test_fixed_held_out_greedy_only_shares_across_seeds(tmp_path):
    held_out = _held_out_file(tmp_path)
    common = ["train.steps=2", f"eval.source={held_out}", "eval.size=8"]
    greedy = plan_comparison(tmp_path / "g", ["grpo", "tepo"], [0, 1], overrides=[*common, "eval.samples=0"])
    assert len({r.held_out_digest for r in greedy.runs}) == 1
    assert _who_evaluated(greedy) == [("grpo", 0)]  # same model, same problems, greedy: computed once
    # The sampled pass is seeded by train.seed: one evaluation per seed again.
    sampled = plan_comparison(tmp_path / "s", ["grpo", "tepo"], [0, 1], overrides=[*common, "eval.samples=1"])
    assert _who_evaluated(sampled) == [("grpo", 0), ("grpo", 1)]
    # Without the planner's held-out digest the seed stays in the key (nothing is assumed).
    blind = plan_comparison(
        tmp_path / "b", ["grpo", "tepo"], [0, 1], overrides=[*common, "eval.samples=0"], check_prompts=False
    )
    assert _who_evaluated(blind) == [("grpo", 0), ("grpo", 1)]


def test_interrupted_run_without_any_checkpoint_restarts(tmp_path):
    plan = plan_comparison(tmp_path, ["grpo"], [0], overrides=["train.steps=2", "train.save_every=0"])
    (spec,) = plan.runs
    spec.run_dir.mkdir(parents=True)
    save_config(spec.config, spec.run_dir / "config.yaml")
    (spec.run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    (spec.run_dir / "eval_before.json").write_text(json.dumps({"eval_greedy_accuracy": 0.25}))
    assert run_state(spec.run_dir) == "interrupted" and not (spec.run_dir / "checkpoints").exists()
    calls = []
    outcomes = run_comparison(
        plan,
        train_fn=lambda config, run_dir: calls.append(("train", run_dir)),
        resume_fn=lambda run_dir: calls.append(("resume", run_dir)),
        log=lambda *a: None,
    )
    assert [o.action for o in outcomes] == ["restarted"] and calls == [("train", spec.run_dir)]
    assert len(list(spec.run_dir.glob("metrics.restarted-*.jsonl"))) == 1
    assert json.loads((spec.run_dir / "eval_before.json").read_text()) == {"eval_greedy_accuracy": 0.25}


# --- Across invocations: a study extended by methods or seeds reuses the initial evaluation it already has ---------


def _train_like_the_trainer(evaluated: list):
    """A stand-in trainer that records its run as the real one does (config.yaml with the precision resolved here,
    precision.json) and scores the initial policy only when eval_before.json is absent."""
    from tepo.precision import resolve_run_precision
    from tepo.training.run_dir import save_run_config
    from tepo.training.setup import run_device

    def train(config, run_dir):
        precision = resolve_run_precision(config, run_device(config))
        run_dir.mkdir(parents=True, exist_ok=True)
        save_run_config(precision.config, run_dir, precision.precision)
        if not (run_dir / "eval_before.json").exists():
            evaluated.append((config.algorithm.loss, config.train.seed))
            (run_dir / "eval_before.json").write_text(json.dumps({"eval_greedy_accuracy": 0.25}))

    return train


def _invoke(directory: Path, methods: list[str], extra: tuple[str, ...] = ()) -> list[tuple[str, int]]:
    evaluated: list = []
    plan = plan_comparison(directory, methods, [0], overrides=["train.steps=2", *extra])
    run_comparison(
        plan, train_fn=_train_like_the_trainer(evaluated), resume_fn=lambda d: None, log=lambda *a: None
    )
    return evaluated


def test_a_later_invocation_reuses_the_initial_evaluation_of_the_same_hardware(tmp_path):
    assert _invoke(tmp_path, ["grpo"]) == [("grpo", 0)]
    assert _invoke(tmp_path, ["tepo", "dapo"]) == []  # the grpo run's evaluation is theirs too
    assert json.loads((tmp_path / "dapo" / "seed0" / "eval_before.json").read_text()) == {
        "eval_greedy_accuracy": 0.25
    }


def test_a_later_invocation_scores_again_when_the_earlier_one_differs(tmp_path):
    assert _invoke(tmp_path, ["grpo"]) == [("grpo", 0)]
    # Other eval settings (pass@k is measured in eval_before.json): not the same evaluation.
    assert _invoke(tmp_path, ["tepo"], ("eval.pass_k_samples=4",)) == [("tepo", 0)]
    # Another CPU kind, or no recorded hardware (runs before precision.json): float arithmetic may differ.
    for run in ("grpo", "tepo"):
        recorded = tmp_path / run / "seed0" / "precision.json"
        recorded.write_text(json.dumps(json.loads(recorded.read_text()) | {"hardware": "Another CPU"}))
    (tmp_path / "tepo" / "seed0" / "precision.json").unlink()
    assert _invoke(tmp_path, ["sapo"]) == [("sapo", 0)]
