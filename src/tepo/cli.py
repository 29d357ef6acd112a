"""``tepo``: the command line.

tepo train [--config PRESET_OR_YAML] [key=value ...]     train (no arguments: the embedded default)
tepo train --resume RUN_DIR [key=value ...]              continue a run from its last intact checkpoint
tepo losses, tepo estimators, tepo presets [--markdown]  what is registered (Markdown: the README's)
tepo config show [PRESET_OR_YAML] [key=value ...]        the resolved configuration, every key explained
tepo reward check FILE:NAME --data ROWS.jsonl            a reward function of your own on data rows, no model
tepo env [--json] [--bench]                              versions, hardware, what tepo picks here
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def _cmd_train(args) -> int:
    from tepo.config import load_config
    from tepo.metrics import read_metrics
    from tepo.report import plot_training_curves, training_summary_table
    from tepo.training import resume, train

    _quiet_transformers()
    if args.resume:
        overrides = list(args.overrides)
        if args.trust_remote_code:
            overrides.append("model.trust_remote_code=true")
        result = resume(Path(args.resume), overrides)
    else:
        config = load_config(args.config, _flag_overrides(args, list(args.overrides)))
        result = train(config)
    rows = read_metrics(result.run_dir / "metrics.jsonl")
    before, after = result.summary.get("before", {}), result.summary.get("after", {})
    marks = {
        "greedy acc. before": (0, before.get("eval_greedy_accuracy")),
        "greedy acc. after": (result.steps_done, after.get("eval_greedy_accuracy")),
    }
    if importlib.util.find_spec("matplotlib") is None:
        # The plot is a convenience: a machine with only torch and transformers (the device check's) still trains.
        png = "none (matplotlib is not installed; `tepo report RUN_DIR` draws it where it is)"
    else:
        png = plot_training_curves(
            rows, result.run_dir / "training_curves.png", title=str(result.run_dir.name), extra_points=marks
        )
    print()
    print(training_summary_table(result.summary))
    print(f"\nrun directory: {result.run_dir}\nplot: {png}\nmetrics: {result.run_dir / 'metrics.jsonl'}")
    return 0


def _flag_overrides(args, overrides: list[str]) -> list[str]:
    """``overrides`` plus what ``train``'s flags (``--model``, ``--data``, ...) set, as ``key=value`` items."""
    flags = (
        ("model", "model.name"),
        ("data", "data.source"),
        ("output_dir", "train.output_dir"),
    )
    out = list(overrides)
    out += [f"{key}={getattr(args, flag)}" for flag, key in flags if getattr(args, flag, None)]
    if getattr(args, "trust_remote_code", False):
        out.append("model.trust_remote_code=true")
    return out


def _quiet_transformers() -> None:
    """Our own bars show progress; transformers' per-load "Loading weights" bars are noise in a CLI run."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _cmd_losses(args) -> int:
    from tepo.losses import describe_table

    print(describe_table(markdown=args.markdown))
    return 0


def _cmd_estimators(args) -> int:
    from tepo.advantages import describe_table

    print(describe_table(markdown=args.markdown))
    return 0


def _cmd_presets(args) -> int:
    from tepo.config.presets import presets_table

    print(presets_table(markdown=args.markdown))
    return 0


def _cmd_config_show(args) -> int:
    from tepo.config import ConfigError, load_config
    from tepo.config.reference import show_config

    # The first item without "=" is the preset or YAML file (or --config names it); the rest are overrides, and
    # train's flags are read as `tepo train` reads them, so a train command shows by changing its verb.
    items = list(args.overrides)
    source = items.pop(0) if items and "=" not in items[0] else None
    if source is not None and args.config is not None:
        raise ConfigError(f"config show: give the configuration once, not both {source!r} and --config")
    source = source or args.config
    items = _flag_overrides(args, items)
    config = load_config(source, items)
    for note in getattr(config, "renamed_key_notes", []):
        print(f"note: {note}", file=sys.stderr)
    title = " ".join([source or "default", *items])
    print(show_config(config, title=title), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tepo", description="RLVR with TEPO and the GRPO family.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "train",
        help="train a policy (no arguments: the embedded default, a few minutes on CPU)",
        epilog="Every configuration key, its meaning and its default: `tepo config show [PRESET_OR_YAML] "
        "[key=value ...]` prints the resolved configuration as YAML, ready to save, edit and pass to --config.",
    )
    p.add_argument(
        "--config",
        help="preset name (see `tepo presets`) or YAML path (e.g. one saved from `tepo config show`)",
    )
    p.add_argument("--resume", metavar="RUN_DIR", help="continue this run from its last intact checkpoint")
    p.add_argument(
        "--model", help="Hugging Face causal LM name or local path (default: embedded SmolLM2-135M)"
    )
    p.add_argument("--data", help="JSONL/Parquet path, Hugging Face dataset name, or procedural task")
    p.add_argument("--output-dir", help="where run directories are created (default: runs)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow models that ship their own code")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="e.g. algorithm.loss=grpo train.steps=20 (every key: `tepo config show`)",
    )
    p.set_defaults(func=_cmd_train)

    _add_config_command(sub)
    listings = (
        ("losses", "list the registered policy losses", _cmd_losses),
        ("estimators", "list the advantage estimators", _cmd_estimators),
        ("presets", "list the configuration presets", _cmd_presets),
    )
    for name, text, func in listings:
        listing = sub.add_parser(name, help=text)
        listing.add_argument("--markdown", action="store_true", help="as a Markdown table (the README's)")
        listing.set_defaults(func=func)
    _register_optional(sub)
    for command in sub.choices.values():
        command.add_argument(
            "--debug",
            action="store_true",
            help="show the Python traceback of an error (without it an error is one line)",
        )
    return parser


def _add_config_command(sub) -> None:
    """``tepo config show [PRESET_OR_YAML] [key=value ...]``, with ``train``'s flags."""
    config = sub.add_parser("config", help="show the resolved configuration, every key with its meaning")
    show = config.add_subparsers(dest="config_command", required=True).add_parser(
        "show",
        help="print a preset or YAML file, with overrides, as commented YAML (tepo train --config reads it); "
        "takes train's --config, --model, --data, --output-dir, so `tepo config show ARGS` shows `tepo train ARGS`",
    )
    show.add_argument("--config", help="preset name or YAML path (as train's --config)")
    show.add_argument("--model", help="as train's --model")
    show.add_argument("--data", help="as train's --data")
    show.add_argument("--output-dir", help="as train's --output-dir")
    show.add_argument("--trust-remote-code", action="store_true", help="as train's --trust-remote-code")
    show.add_argument(
        "overrides",
        nargs="*",
        metavar="[PRESET_OR_YAML] [key=value ...]",
        help="a preset name or YAML path (default: the embedded default), then dotted overrides",
    )
    show.set_defaults(func=_cmd_config_show)


def _register_optional(sub) -> None:
    """Commands that live in their own modules (eval, compare, report) register themselves here when present."""
    import importlib

    modules = (
        "tepo.evaluate.cli",
        "tepo.rewards.cli",
        "tepo.report.compare_cli",
        "tepo.report.cli",
        "tepo.env_report",
    )
    for module in modules:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
            continue
        mod.register(sub)


def main(argv: list[str] | None = None) -> int:
    from tepo.config import ConfigError
    from tepo.data import DataError
    from tepo.models import ModelLoadError
    from tepo.rewards import RewardFunctionsFailing

    parser = build_parser()
    # parse_known_args + re-adding key=value leftovers: `tepo train a=1 --data F b=2` works (argparse alone
    # refuses positionals after an option once the nargs="*" list has been consumed).
    args, rest = parser.parse_known_args(argv)
    if rest:
        if hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in rest):
            args.overrides = [*args.overrides, *rest]
        else:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.func(args)
    except (ConfigError, DataError, ModelLoadError, RewardFunctionsFailing) as err:
        print(f"tepo: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        from tepo.checkpoint import CheckpointError
        from tepo.rollout.base import RolloutError
        from tepo.training import TrainingStopped

        if getattr(args, "debug", False) or not isinstance(
            err, (TrainingStopped, CheckpointError, RolloutError)
        ):
            raise
        if isinstance(err, RolloutError):
            # The engine's traceback is in its log and behind --debug; the run's checkpoints and metrics are intact.
            resume = " (resume with `tepo train --resume RUN_DIR`)" if args.command == "train" else ""
            print(f"tepo: error: {err.summary()}{resume}", file=sys.stderr)
        else:
            print(f"tepo: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: resume with `tepo train --resume RUN_DIR`", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
