"""``tepo eval``: evaluate a model on math benchmarks the way the TEPO and ERPO papers report them.

    tepo eval --bench gsm8k --limit 50 --max-new-tokens 256           embedded model, greedy accuracy
    tepo eval --model runs/RUN --bench math500,aime24                  a training run's latest checkpoint
    tepo eval --model Qwen/Qwen2.5-Math-7B --protocol tepo             TEPO paper protocol (avg@32 on AIME/AMC)
    tepo eval --bench amc23 --temperature 0.6 --num-samples 16 --pass-k 1,4,16

Registered into ``tepo``'s parser by ``tepo.cli`` (``register(subparsers)``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from tepo.evaluate.settings import (
    BENCHMARK_INSTRUCTION,
    DEFAULT_ANSWER_FORMAT,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_PASS_K,
    PROTOCOLS,
    TEPO_BENCHMARKS,
    EvalError,
)
from tepo.rewards import ANSWER_FORMAT_DESCRIPTIONS, COMPLETION_ANSWER_FORMATS
from tepo.rollout.registry import rollout_backend_choices


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 1,2,4,8; got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers >= 1 such as 1,2,4,8; got {text!r}"
        )
    return values


def register(subparsers) -> None:
    from tepo.evaluate.benchmarks import benchmark_names

    p = subparsers.add_parser(
        "eval",
        help="evaluate a model on math benchmarks (greedy accuracy, avg@k, pass@k, boxed rate)",
        description="Evaluate a model on math benchmarks. Writes results.json and samples.jsonl (every response, "
        "its extracted answer and verdict) to --output-dir; rerunning the same command resumes an interrupted "
        "evaluation without redoing finished problems.",
    )
    p.add_argument(
        "--model",
        default=None,
        help="Hugging Face name, local model directory, a `tepo train` run directory (its latest "
        "checkpoint) or one checkpoint directory (default: the embedded SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--bench",
        action="append",
        metavar="NAMES",
        help=f"comma-separated benchmark names ({', '.join(benchmark_names())}) or JSONL paths with "
        "problem/answer fields; repeatable (default with --protocol tepo: "
        f"{','.join(TEPO_BENCHMARKS)})",
    )
    p.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        help="named protocol: tepo = AIME24/25 and AMC23 sampled at temperature 0.6 with 32 samples "
        "(avg@32), the rest greedy, 8192 new tokens (TEPO paper, Sec. 4)",
    )
    p.add_argument(
        "--data-dir",
        help="directory with <benchmark>/test.jsonl (default: $TEPO_DATA_DIR; without either, each benchmark "
        "is loaded from the Hugging Face hub)",
    )
    _add_sampling_arguments(p)
    _add_output_and_engine_arguments(p)
    p.set_defaults(func=run_eval)


def _add_sampling_arguments(p) -> None:
    """How many problems, and how each is sampled and judged."""
    p.add_argument("--limit", type=_positive_int, help="evaluate only the first N problems of each benchmark")
    p.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        help=f"generation limit per response (default {DEFAULT_MAX_NEW_TOKENS}; 8192 with --protocol tepo)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        help="0 (default) = greedy, one response per problem; > 0 samples --num-samples responses",
    )
    p.add_argument(
        "--num-samples", type=_positive_int, help="responses per problem when sampling (default 1)"
    )
    p.add_argument("--top-p", type=float, help="nucleus sampling threshold (default 1.0: off)")
    p.add_argument(
        "--pass-k",
        type=_int_list,
        default=list(DEFAULT_PASS_K),
        help="k values for pass@k, comma-separated; those above the sample count are skipped "
        "(default 1,2,4,...,128)",
    )
    p.add_argument(
        "--batch-size",
        type=_positive_int,
        default=None,
        help="prompts per generation batch, each with all its samples (default: the engine's: with vLLM as many "
        "as fill its 256 concurrent sequences, e.g. 256 greedy or 8 with 32 samples; 8 with HF generate). "
        "Batch b is sampled with seed + b, so a resumed evaluation needs the same batch size",
    )
    p.add_argument(
        "--max-rows",
        type=_positive_int,
        help="at most this many sequences per generate call (caps memory with many samples)",
    )
    p.add_argument("--seed", type=int, default=0, help="sampling seed (batch b uses seed + b; default 0)")
    p.add_argument(
        "--instruction",
        default=BENCHMARK_INSTRUCTION,
        help=f"appended to every problem (default: {BENCHMARK_INSTRUCTION!r})",
    )
    p.add_argument(
        "--answer-format",
        default=DEFAULT_ANSWER_FORMAT,
        choices=COMPLETION_ANSWER_FORMATS,
        help="; ".join(f"{name}: {ANSWER_FORMAT_DESCRIPTIONS[name]}" for name in COMPLETION_ANSWER_FORMATS)
        + f" (default: {DEFAULT_ANSWER_FORMAT})",
    )


def _add_output_and_engine_arguments(p) -> None:
    """Where the results go, the reward workers, and the model's device, dtype and engine."""
    p.add_argument("--output-dir", help="where results.json and samples.jsonl go (default: evals/<model>)")
    p.add_argument("--overwrite", action="store_true", help="discard earlier results in --output-dir")
    p.add_argument("--reward-workers", type=_positive_int, default=2, help="math-verify worker processes")
    p.add_argument(
        "--reward-timeout", type=float, default=10.0, help="seconds allowed to verify one response"
    )
    p.add_argument(
        "--reward-function",
        action="append",
        metavar="[LABEL=]PATH:NAME",
        help="a reward function of your own (a .py file or a module, and the function's name; verl's "
        "compute_score or TRL's reward_func form, as in reward.functions), scored beside math-verify's "
        "accuracy into each benchmark's rewards.<LABEL> (mean, errors, timeouts; LABEL defaults to NAME, "
        "and tells apart two files' functions of one name: a=a.py:compute_score); repeatable",
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="model weights dtype (default auto: float32 on CPU, bfloat16 on a GPU that computes it natively)",
    )
    p.add_argument(
        "--rollout",
        choices=rollout_backend_choices(),
        default="auto",
        help="generation engine: auto (the default: vllm where installed, as `tepo train` does, else hf), vllm "
        "(vLLM in a server process; on CPU from .venv-vllm, see scripts/install_vllm_cpu.sh), hf (transformers "
        "generate)",
    )
    p.add_argument("--trust-remote-code", action="store_true", help="allow models that ship their own code")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _split_benches(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for value in values or []:
        out += [v.strip() for v in value.split(",") if v.strip()]
    return out


def _slug(info: dict) -> str:
    if info["kind"] in ("run", "checkpoint"):
        text = f"{Path(info['run_dir']).name}-step{info.get('step')}"
    elif info["kind"] == "path":
        text = Path(info["spec"]).name
    else:
        text = info["spec"].replace("/", "__")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text) or "model"


def build_tasks(args) -> list:
    """Benchmarks with their problems and settings from the parsed arguments (before any model is loaded)."""
    from tepo.evaluate.benchmarks import describe_source, resolve_benchmark
    from tepo.evaluate.runner import BenchmarkTask
    from tepo.evaluate.settings import make_setting, protocol_settings

    benches = _split_benches(args.bench)
    if not benches:
        if args.protocol != "tepo":
            raise EvalError("no benchmark given: pass --bench NAME[,NAME...] (or --protocol tepo)")
        benches = list(TEPO_BENCHMARKS)
    if len(set(benches)) != len(benches):
        raise EvalError(f"a benchmark is listed twice: {benches}")
    if args.protocol:
        settings = protocol_settings(
            args.protocol,
            benches,
            max_new_tokens=args.max_new_tokens,
            num_samples=args.num_samples,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            instruction=args.instruction,
            answer_format=args.answer_format,
        )
    else:
        one = make_setting(
            temperature=args.temperature or 0.0,
            num_samples=args.num_samples,
            top_p=1.0 if args.top_p is None else args.top_p,
            max_new_tokens=args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
            seed=args.seed,
            instruction=args.instruction,
            answer_format=args.answer_format,
        )
        settings = dict.fromkeys(benches, one)
    tasks = []
    for name in benches:
        problems = resolve_benchmark(name, args.data_dir)
        if args.limit:
            problems = problems[: args.limit]
        tasks.append(
            BenchmarkTask(_task_key(name), problems, settings[name], describe_source(name, args.data_dir))
        )
    keys = [t.name for t in tasks]
    if len(set(keys)) != len(keys):
        raise EvalError(f"two benchmarks would share a name in the output files: {keys}; rename a file")
    return tasks


def eval_reward_functions(specs: list[str] | None) -> list:
    """``--reward-function [LABEL=]PATH:NAME`` values as the user's reward functions (loaded and checked by
    :func:`tepo.rewards.reward_functions_from_specs`); EvalError with one line per problem."""
    from tepo.rewards import reward_functions_from_specs

    try:
        return reward_functions_from_specs(specs)
    except ValueError as err:
        raise EvalError(str(err)) from None


def _task_key(name: str) -> str:
    """A benchmark's key in the output files: its name, or for a file its stem (its folder for test.jsonl)."""
    from tepo.evaluate.benchmarks import BENCHMARKS

    if name in BENCHMARKS:
        return name
    path = Path(name)
    return path.parent.name if path.stem in ("test", "train", "data") and path.parent.name else path.stem


def _device_and_dtype(args):
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dtype == "auto":  # tepo.precision decides: float32 on the CPU, bf16 on a GPU with native bf16
        from tepo.precision import evaluation_dtype

        name, reason = evaluation_dtype(device)
        print(f"precision: {name} weights ({reason}; --dtype chooses another)", file=sys.stderr)
        dtype = getattr(torch, name)
    else:
        dtype = getattr(torch, args.dtype)
    return device, dtype


def run_eval(args) -> int:
    from tepo.checkpoint import CheckpointError
    from tepo.data import DataError

    output_dir = None
    try:
        tasks = build_tasks(args)  # data problems surface before the model loads
        reward_functions = eval_reward_functions(args.reward_function)  # and bad reward files
        from tepo.config import HfRolloutConfig, ParityConfig, RolloutConfig, VllmConfig
        from tepo.evaluate.loading import describe_model, load_eval_model
        from tepo.evaluate.runner import evaluate_benchmarks, results_table
        from tepo.rollout import make_rollout_from_config

        info = describe_model(args.model)
        output_dir = Path(args.output_dir) if args.output_dir else Path("evals") / _slug(info)
        device, dtype = _device_and_dtype(args)
        for note in info.get("skipped_checkpoints", []):
            print(f"note: {note}", file=sys.stderr)
        where = f" (checkpoint step {info['step']})" if info.get("checkpoint") else ""
        print(f"loading model {info['spec']}{where} on {device}...", file=sys.stderr)
        model, tokenizer, info = load_eval_model(
            args.model, device=device, dtype=dtype, trust_remote_code=args.trust_remote_code
        )
        rollout_config = RolloutConfig(
            backend=args.rollout,
            # HF generate runs the model as loaded (--dtype), with tepo.precision's standalone autocast default
            # (off on the CPU, on where a GPU computes bf16 natively).
            autocast_bf16=None,
            hf=HfRolloutConfig(max_batch_size=args.max_rows),
            # A vLLM engine computes in the model's --dtype too (float32 on CPU unless --dtype bfloat16, which
            # vLLM's CPU build runs about 2x faster).
            vllm=VllmConfig(dtype=str(dtype).removeprefix("torch.")),
            parity=ParityConfig(check=False),  # the weights never change here: no sync to check
        )
        output_dir.mkdir(parents=True, exist_ok=True)
        backend = make_rollout_from_config(
            rollout_config,
            model,
            tokenizer,
            seed=args.seed,
            run_dir=output_dir,  # a vLLM engine's log: <output-dir>/vllm_server.log
            log=lambda msg: print(msg, file=sys.stderr),
        )
        with backend:
            report = evaluate_benchmarks(
                backend,
                tokenizer,
                tasks,
                output_dir,
                model_info=info,
                batch_size=args.batch_size,
                pass_k=args.pass_k,
                reward_workers=args.reward_workers,
                reward_timeout_s=args.reward_timeout,
                overwrite=args.overwrite,
                progress=not args.no_progress,
                protocol=args.protocol,
                log=lambda msg: print(msg, file=sys.stderr),
                reward_functions=reward_functions,
            )
    except (EvalError, DataError, CheckpointError) as err:
        print(f"tepo eval: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = f" (finished problems are kept in {output_dir / 'samples.jsonl'})" if output_dir else ""
        print(f"\ninterrupted: run the same command again to resume{hint}", file=sys.stderr)
        return 130
    print()
    print(results_table(report.results, [t.name for t in tasks]))
    for outcome in report.outcomes:
        if outcome.resumed:
            print(
                f"{outcome.name}: {outcome.resumed} problems from an earlier run, {outcome.generated} generated now"
            )
    print(f"\nresults: {output_dir / 'results.json'}\nsamples: {output_dir / 'samples.jsonl'}")
    return 0
