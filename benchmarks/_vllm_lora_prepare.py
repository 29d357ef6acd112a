"""The preparation of benchmarks/bench_vllm_lora.py, run with tepo's interpreter (torch, transformers, peft, tepo):
the base, merged and adapter folders, the trainer side of a sync timed each way, the float32 references.

    .venv/bin/python benchmarks/_vllm_lora_prepare.py --work FOLDER [--b-std 0.1] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _vllm_lora_common import ALPHA, PROMPTS, RANK, REF_TOKENS, TARGETS, median


def _completion_logprobs(model, full, prompt_len: int) -> list[float]:
    """Teacher-forced log-probs (float32 log-softmax) of ``full[0, prompt_len:]`` under ``model``."""
    import torch

    logits = model(input_ids=full).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs.gather(-1, full[0, 1:, None])[:, 0][prompt_len - 1 :].tolist()


def _prompt_ids(tokenizer) -> list[list[int]]:
    prompt_ids = []
    for text in PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if hasattr(ids, "keys"):  # a BatchEncoding on some transformers versions
            ids = ids["input_ids"]
        prompt_ids.append([int(t) for t in ids])
    return prompt_ids


def _randomize_adapter(model, seed: int, b_std: float) -> int:
    """B ~ N(0, b_std^2) in every LoRA layer (B = 0 would be the base model); the number of layers."""
    import torch
    from peft.tuners.lora import LoraLayer

    gen = torch.Generator().manual_seed(seed + 1)
    adapted = 0
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLayer):
                for name in module.lora_B:
                    weight = module.lora_B[name].weight
                    weight.copy_(torch.randn(weight.shape, generator=gen) * b_std)
                    adapted += 1
    return adapted


def _time_writes(model, work: Path) -> dict:
    """Trainer side of one sync, each way (median of 3): the merged folder against the adapter folder."""
    import torch

    from tepo.rollout.weight_sync import write_weights

    merged_s, adapter_s = [], []
    for _ in range(3):
        start = time.perf_counter()
        merged_bytes = write_weights(model, work / "merged", torch.bfloat16)
        merged_s.append(time.perf_counter() - start)
    for _ in range(3):
        start = time.perf_counter()
        model.save_pretrained(str(work / "adapter"))
        adapter_s.append(time.perf_counter() - start)
    return {
        "write_merged_s": median(merged_s),
        "write_merged_all_s": merged_s,
        "write_adapter_s": median(adapter_s),
        "write_adapter_all_s": adapter_s,
        "merged_bytes": merged_bytes,
        "adapter_bytes": sum(p.stat().st_size for p in (work / "adapter").glob("*.safetensors")),
    }


def _merge_check(model, work: Path) -> dict:
    """The merged file is W0 + (alpha/r) B A of one adapted layer: the largest error, and the mean change."""
    from safetensors.torch import load_file

    merged = load_file(str(work / "merged" / "model.safetensors"))
    base = load_file(str(work / "base" / "model.safetensors"))
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    expected = (
        layer.base_layer.weight
        + (ALPHA / RANK) * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    )
    name = "model.layers.0.self_attn.q_proj.weight"
    return {
        "merge_check_max_abs_err": float((merged[name].float() - expected).abs().max()),
        "merge_check_mean_abs_delta": float((merged[name].float() - base[name].float()).abs().mean()),
    }


def _references(model, tokenizer, prompt_ids, eos, ref_tokens: int) -> dict:
    """Float32 references: the adapted model's greedy continuations, scored by the adapted and the base model."""
    import torch

    sequences, ref_adapted, ref_base, ref_greedy = [], [], [], []
    with torch.no_grad():
        for ids in prompt_ids:
            inp = torch.tensor([ids])
            out = model.generate(
                input_ids=inp,
                attention_mask=torch.ones_like(inp),
                max_new_tokens=ref_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=tokenizer.pad_token_id,
            )[0].tolist()
            completion = out[len(ids) :]
            ref_greedy.append(completion)
            full = torch.tensor([out])
            sequences.append({"prompt": ids, "completion": completion})
            ref_adapted.append(_completion_logprobs(model, full, len(ids)))
            with model.disable_adapter():
                ref_base.append(_completion_logprobs(model, full, len(ids)))
    return {
        "sequences": sequences,
        "ref_adapted_logprobs": ref_adapted,
        "ref_base_logprobs": ref_base,
        "ref_greedy": ref_greedy,
    }


def prepare(work: Path, b_std: float, seed: int, ref_tokens: int) -> dict:
    """Write base/, merged/ and adapter/ into ``work``, time the trainer side of a sync, compute float32 references."""
    import torch

    from tepo.config import LoraConfig
    from tepo.lora import apply_lora
    from tepo.models import load_model_and_tokenizer
    from tepo.rollout.base import eos_token_ids
    from tepo.rollout.weight_sync import write_weights

    torch.manual_seed(seed)
    model, tokenizer = load_model_and_tokenizer(None)
    eos = eos_token_ids(model, tokenizer)
    prompt_ids = _prompt_ids(tokenizer)
    write_weights(model, work / "base", torch.bfloat16)  # before the adapters go in
    model = apply_lora(model, LoraConfig(rank=RANK, alpha=ALPHA, dropout=0.0, target_modules=TARGETS))
    adapted = _randomize_adapter(model, seed, b_std)
    model.eval()
    writes = _time_writes(model, work)
    meta = {
        "prompt_ids": prompt_ids,
        "eos_token_ids": eos,
        "max_model_len": min(int(getattr(model.config, "max_position_embeddings", 4096) or 4096), 4096),
        **_references(model, tokenizer, prompt_ids, eos, ref_tokens),
        "lora_layers": adapted,
        "b_std": b_std,
        **writes,
        **_merge_check(model, work),
    }
    (work / "prepared.json").write_text(json.dumps(meta))
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--b-std", type=float, default=0.1, help="std of the adapter's random B")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    prepare(args.work, args.b_std, args.seed, ref_tokens=REF_TOKENS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
