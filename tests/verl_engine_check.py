"""One rank of tests/integrations/test_integration_verl_engine.py: verl 0.9.1's actor worker, one SGD step per loss, on CPU.

Run by ``torchrun --nproc_per_node W`` inside ``.venv-verl`` with ``VERL_USE_EXTERNAL_MODULES=verl_cpu_platform``
(tests/verl_cpu_platform.py) and this directory on ``PYTHONPATH``; tepo's losses come in through verl's plugin
entry point. Arguments: the model directory and an output directory. Every rank builds verl's own
``ActorRolloutRefWorker(role="actor")`` from verl's packaged Hydra config (``init_model``: TrainingWorker, FSDP2
engine over gloo, SGD), then for each case of `CASES`:

1. rank 0 has gathered the engine's full parameters into a plain Hugging Face copy of the model (the reference,
   once: every case starts from the same parameters, restored after each step), and from its forward makes the
   case's batch: pi_old's log-probs (the current ones plus noise, so some ratios clip),
   pi_old's entropies, advantages, rollout-correction weights; broadcast to every rank;
2. the batch goes the driver's way (``DataProto`` -> ``left_right_2_no_padding``, the non-tensor fields verl's
   ``_update_actor`` sets), is split as verl's dispatch splits it (``BatchData.chunk(W)``, rank r gets chunk r)
   and trained with ``update_actor`` (verl's ``train_mini_batch``: one mini-batch, its micro-batches of 2 rows,
   ``forward_backward_batch``, ``optimizer_step``) with ``ppo_loss`` (or `tepo_ppo_loss` for TEPO v2) and the
   case's actor config, converted by verl's ``omega_conf_to_dataclass``;
3. the update of `CHECKED` parameters (before - after) is saved, with ``lr * grad`` of the reference:
   ``compute_policy_loss`` on the whole batch (kl_cov: summed over the same 2-row micro-batches, see `CASES`).

Rank 0 writes ``{out}/updates_w{W}.pt`` (tensors) and prints a JSON report; the test compares.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from functools import partial

import torch
import torch.distributed as dist
import verl  # loads verl_cpu_platform and tepo's plugin first
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM
from verl import DataProto
from verl.protocol import BatchData
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import left_right_2_no_padding

from tepo.integrations.verl import OLD_ENTROPY_KEY, tepo_ppo_loss
from tepo.losses import compute_policy_loss
from verl_batch import padded_batch
from verl_cpu_platform import HYDRA_OVERRIDES

MODEL, OUT = sys.argv[1], pathlib.Path(sys.argv[2])
LR = 1.0  # SGD without weight decay or clipping: the update is exactly -LR * gradient
B, P, R = 8, 6, 16  # global batch: 8 responses of up to 16 tokens after prompts of up to 6
MICRO = 2  # rows per micro-batch on every rank: 1 rank -> 4 micro-batches, 2 ranks -> 2 each
SCALE = 24  # actor.loss_scale_factor (Dr. GRPO's constant), != R so that a wrong constant shows
CHECKED = (
    "model.embed_tokens.weight",  # tied with lm_head: gets gradient from both ends
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.29.mlp.down_proj.weight",
    "model.norm.weight",
)
# (label, policy_loss (TepoPolicyLossConfig fields), actor.loss_agg_mode, TEPO v2?, rollout_is_weights?,
#  reference over the whole batch?). kl_cov picks its top-k tokens among each call's tokens (as verl's own
#  kl_cov does), so no split of it equals the whole batch: its reference is compute_policy_loss summed over the
#  same 2-row micro-batches, with the global counts -- and since those micro-batches are the same on 1 and 2
#  ranks, its 1-rank and 2-rank updates are still equal.
CASES = [
    ("tepo", {"loss_mode": "tepo", "eps": 0.2}, "token-mean", False, False, True),
    ("grpo", {"loss_mode": "grpo"}, "seq-mean-token-mean", False, False, True),
    ("dr_grpo", {"loss_mode": "dr_grpo"}, "seq-mean-token-sum-norm", False, False, True),
    (
        "kl_cov",
        {"loss_mode": "tepo.kl_cov", "kl_cov_ratio": 0.5, "kl_cov_coef": 0.7},
        "token-mean",
        False,
        False,
        False,
    ),
    ("tepo_v2", {"loss_mode": "tepo", "eps": 0.2, "tepo_kl_mask_coef": 0.5}, "token-mean", True, False, True),
    ("grpo_is", {"loss_mode": "grpo"}, "seq-mean-token-mean", False, True, True),
    ("tepo_is", {"loss_mode": "tepo", "eps": 0.2}, "token-mean", False, True, True),
]

torch.manual_seed(0)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
verl_configs = str(pathlib.Path(verl.__file__).parent / "trainer" / "config")
with initialize_config_dir(config_dir=verl_configs, version_base=None):
    cfg = compose(
        config_name="ppo_trainer",
        overrides=[
            *HYDRA_OVERRIDES,
            f"actor_rollout_ref.model.path={MODEL}",
            "actor_rollout_ref.rollout.n=1",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={B}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
            "actor_rollout_ref.actor.optim.optimizer=SGD",
            f"actor_rollout_ref.actor.optim.lr={LR}",
            "actor_rollout_ref.actor.optim.weight_decay=0.0",
            "actor_rollout_ref.actor.optim.clip_grad=1e30",
            "actor_rollout_ref.actor.grad_clip=1e30",
            f"actor_rollout_ref.actor.loss_scale_factor={SCALE}",
        ],
    )
OmegaConf.resolve(cfg)
worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
worker.init_model()  # initialises the gloo process group (verl_cpu_platform's backend), builds the engine
engine = worker.actor.engine
assert type(engine).__name__ == "FSDPEngineWithLMHead" and engine.get_data_parallel_size() == world
assert dist.get_backend() in ("gloo", "cpu:gloo"), dist.get_backend()
module = engine.module
params = dict(module.named_parameters())
assert all(name in params for name in CHECKED), [n for n in CHECKED if n not in params]


def full(name):
    p = params[name]
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()


def actor_config(policy_loss, agg, calculate_entropy=False):
    # what init_model does with the actor's Hydra node, with this case's loss
    node = OmegaConf.to_container(cfg.actor_rollout_ref.actor, resolve=True)
    node["policy_loss"] = {"_target_": "tepo.integrations.verl.TepoPolicyLossConfig", **policy_loss}
    node.update(loss_agg_mode=agg, calculate_entropy=calculate_entropy)
    return omega_conf_to_dataclass(OmegaConf.create(node))


# Fixed token layout (the same on every rank): left-padded prompts, right-padded responses, unequal lengths so
# the two ranks hold different token counts (rank 0: 42, rank 1: 29 before rejection).
prompt_lens = [6, 3, 5, 2, 4, 6, 1, 3]
resp_lens = [16, 9, 12, 5, 3, 14, 4, 8]
gen = torch.Generator().manual_seed(1)
ref = None
if rank == 0:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # noqa: F401

    ref = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="sdpa")
    for n, p in ref.named_parameters():  # gradients of the checked tensors only: memory is shared and scarce
        p.requires_grad_(n in CHECKED)
V = ref.config.vocab_size if ref is not None else 0
V = torch.tensor([V])
dist.broadcast(V, 0)
V = int(V)
prompts, responses, attn, input_ids, position_ids, response_mask = padded_batch(
    prompt_lens, resp_lens, P, R, V, gen
)
reject_mask = response_mask.clone()
reject_mask[5] = 0  # a rejected row (verl's rejection modes AND it into response_mask): rank 1's longest
adv = torch.tensor([1.0, -0.5, 0.7, 0.3, -1.2, 0.9, -0.4, 0.6]).unsqueeze(-1).expand(B, R) * response_mask


def ref_forward():
    # The reference: a plain forward of the whole padded batch, log-probs and entropies of the response tokens.
    logits = ref(input_ids=input_ids, attention_mask=attn, position_ids=position_ids).logits[:, P - 1 : -1]
    logp_all = torch.log_softmax(logits.float(), -1)
    logp = logp_all.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def state_to_ref():
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        missing, unexpected = ref.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)


def counting(loss_fn, calls):
    # the actor loss, recording the rows of each micro-batch this rank computes
    def counted(model_output, data, dp_group=None):
        calls.append(int(data["response_mask"].shape[0]))
        return loss_fn(model_output=model_output, data=data, dp_group=dp_group)

    return counted


# Every case starts from the same parameters: each rank keeps its own shards and puts them back after the step
# (SGD keeps no state). Chained steps of lr 1 would amplify float differences between the 1- and 2-rank runs.
initial = {n: (p.to_local() if hasattr(p, "to_local") else p).detach().clone() for n, p in params.items()}


def restore():
    with torch.no_grad():
        for n, p in params.items():
            (p.to_local() if hasattr(p, "to_local") else p).copy_(initial[n])


state_to_ref()  # the reference model holds the engine's (initial) parameters
saved, report = {}, {"world": world, "cases": {}}
for label, policy_loss, agg, tepo_v2, use_is, whole_batch in CASES:
    made = torch.zeros(3, B, R)
    if rank == 0:
        with torch.no_grad():
            lp0, ent0 = ref_forward()
        made[0] = (lp0 + 0.15 * torch.randn(B, R, generator=gen)) * response_mask  # old log-probs
        made[1] = (ent0 + 0.4 * (torch.rand(B, R, generator=gen) - 0.3)) * response_mask  # old entropies
        made[2] = (0.25 + 1.5 * torch.rand(B, R, generator=gen)) * response_mask  # IS weights, 0 on padding
    dist.broadcast(made, 0)
    old, old_ent, weights = made[0], made[1], made[2]
    mask = reject_mask if use_is else response_mask
    fields = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": input_ids,
        "attention_mask": attn,
        "position_ids": position_ids,
        "response_mask": mask,
        "old_log_probs": old,
        "advantages": adv,
    }
    if use_is:
        fields["rollout_is_weights"] = weights * mask
    if tepo_v2:
        fields[OLD_ENTROPY_KEY] = old_ent  # where TepoRayPPOTrainer keeps pi_old's entropies
    batch = DataProto.from_single_dict(fields, meta_info={"temperature": 1.0})
    td = left_right_2_no_padding(batch.to_tensordict())  # the driver's conversion (ray_trainer._update_actor)
    # what verl's trainer sets on the update's batch: one mini-batch of the whole batch, one epoch, the loss on
    meta = dict(
        calculate_entropy=tepo_v2, distillation_use_topk=False, distillation_only=False, compute_loss=True
    )
    steps = dict(
        global_batch_size=B, mini_batch_size=B, epochs=1, seed=42, dataloader_kwargs={"shuffle": False}
    )
    tu.assign_non_tensor(td, **meta, **steps)
    mine = BatchData(td).chunk(chunks=world)[rank]  # verl's dispatch: rank r gets chunk r
    mine = mine.clone().unlock_()  # what a Ray worker receives is a deserialised, unlocked copy

    config = actor_config(policy_loss, agg, calculate_entropy=tepo_v2)
    calls = []
    worker.set_loss_fn(counting(partial(tepo_ppo_loss if tepo_v2 else ppo_loss, config=config), calls))
    before = {n: full(n) for n in CHECKED}
    out = worker.update_actor(mine)
    after = {n: full(n) for n in CHECKED}
    update = {n: before[n] - after[n] for n in CHECKED}
    restore()
    assert all(torch.equal(full(n), before[n]) for n in CHECKED), "parameters not restored"

    if rank == 0:
        name = policy_loss["loss_mode"].removeprefix("tepo.")
        options = {k: v for k, v in policy_loss.items() if k != "loss_mode"}
        options.update(agg=agg, max_len=float(SCALE))
        ref.zero_grad(set_to_none=True)
        logp, entropy = ref_forward()
        common = {"is_weights": fields.get("rollout_is_weights")}
        if tepo_v2:
            common.update(entropy=entropy, old_entropy=old_ent)
        if whole_batch:
            loss, metrics = compute_policy_loss(
                name, logp=logp, old_logp=old, advantages=adv, mask=mask.bool(), **common, **options
            )
        else:  # the micro-batches verl runs: rows [0, 1], [2, 3], ... with the global counts
            loss = 0.0
            for start in range(0, B, MICRO):
                rows = slice(start, start + MICRO)
                part, metrics = compute_policy_loss(
                    name,
                    logp=logp[rows],
                    old_logp=old[rows],
                    advantages=adv[rows],
                    mask=mask[rows].bool(),
                    num_tokens=int(mask.sum()),
                    num_seqs=B,
                    **{k: (v[rows] if torch.is_tensor(v) else v) for k, v in common.items()},
                    **options,
                )
                loss = loss + part
        loss.backward()
        unweighted = None
        if use_is:  # the weights must matter, or passing them through proves nothing
            with torch.no_grad():
                unweighted = float(
                    compute_policy_loss(
                        name, logp=logp, old_logp=old, advantages=adv, mask=mask.bool(), **options
                    )[0]
                )
        named = dict(ref.named_parameters())
        expected = {n: LR * named[n].grad.detach().clone() for n in CHECKED}
        saved[label] = {"update": update, "expected": expected}
        verl_metrics = tu.get(out, "metrics") if out is not None else {}
        verl_loss = verl_metrics.get("loss")
        verl_loss = (
            float(torch.tensor(verl_loss, dtype=torch.float64).mean()) if verl_loss is not None else None
        )
        report["cases"][label] = {
            "loss": float(loss.detach()),
            "verl_loss": verl_loss,
            "tokens": int(mask.sum()),
            "clip_frac": metrics.get("clip_frac_high", 0.0) + metrics.get("clip_frac_low", 0.0),
            "max_rel_err": max(
                float((update[n] - expected[n]).abs().max() / expected[n].abs().max()) for n in CHECKED
            ),
            "unweighted_loss": unweighted,
            "micro_batches": calls,
            "tepo_kl_mask_frac": metrics.get("tepo_kl_mask_frac"),
            "tepo_metrics": sorted(k for k in verl_metrics if k.startswith("actor/tepo/")),
        }

if rank == 0:
    torch.save(saved, OUT / f"updates_w{world}.pt")
    (OUT / f"report_w{world}.json").write_text(json.dumps(report))
    print("REPORT " + json.dumps(report))
dist.barrier()
dist.destroy_process_group()
