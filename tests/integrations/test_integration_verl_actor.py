"""verl 0.9.1's actor loss path on a real model forward (CPU, in ``.venv-verl``): values and gradients.

What runs is verl's own code from the driver's batch conversion to the backward, minus the FSDP engine:
``left_right_2_no_padding`` (the driver's conversion before ``update_actor``), the engine's global counts
(``batch_num_tokens``, ``dp_size``; one rank), ``prepare_micro_batches`` (verl's micro-batch split, here 2 micro-batches
of 2 rows), the actor loss ``verl.workers.utils.losses.ppo_loss`` (or `tepo.integrations.verl.tepo_ppo_loss`)
with ``ActorConfig`` built through verl's Hydra conversion, and ``loss.backward()`` per micro-batch. The forward is
the real embedded model (SmolLM2-135M, float32), its per-token log-probs and entropies put in verl's no-padding
(nested) layout with verl's ``logprobs_from_logits`` / ``entropy_from_logits``. Gradients of three parameter
tensors are compared with ``compute_policy_loss`` on the same forward:

1. verl's ``rollout_is_weights`` and a rejected row (rejection ANDed into ``response_mask``, as verl does): our
   ``dapo`` loss through verl equals ``compute_policy_loss("dapo", is_weights=w)`` and verl's own ``vanilla``.
2. TEPO v2: ``loss_mode=tepo`` with ``tepo_kl_mask_coef`` through `tepo_ppo_loss` (H from the forward, H_old from
   the batch field ``old_entropys`` as `TepoRayPPOTrainer` leaves it, and from the nested per-response field
   ``entropy`` as verl's v1 driver stores it) equals ``compute_policy_loss("tepo", entropy=H, old_entropy=H_old,
   ...)``.
3. verl's plain ``ppo_loss`` with ``tepo_kl_mask_coef`` raises (the mask term is never silently dropped).
4. Where verl's own actor worker stops on a CPU-only machine (``ActorRolloutRefWorker.init_model``): asserted, so
   docs/integrations.md's statement is checked and a verl that runs on CPU makes this test say so.

The FSDP engine itself (``FSDPEngine``), Ray, NCCL and vLLM do not run here (see docs/integrations.md).
"""

from __future__ import annotations

import socket
import textwrap

import pytest

from verl_runner import ROOT, run_verl_script, verl_env

pytestmark = pytest.mark.slow

ACTOR_SCRIPT = textwrap.dedent(
    r"""
    import json, sys
    import verl  # noqa: F401  (loads tepo's plugin)
    import torch
    from functools import partial
    from omegaconf import OmegaConf
    from tensordict import TensorDict
    from transformers import AutoModelForCausalLM
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits
    from verl.workers.config import ActorConfig
    from verl.workers.engine.utils import prepare_micro_batches
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, response_to_nested
    from tepo.integrations.verl import OLD_ENTROPY_KEY, tepo_ppo_loss
    from tepo.losses import compute_policy_loss
    from verl_batch import padded_batch  # tests/ is on PYTHONPATH

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
    model.eval()  # dropout off: two forwards give the same tensors
    CHECKED = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight")
    params = {n: p for n, p in model.named_parameters() if n in CHECKED}
    assert len(params) == 3, list(params)

    B, P, R = 4, 5, 6
    prompt_lens, resp_lens = [5, 3, 4, 2], [6, 4, 1, 5]
    gen = torch.Generator().manual_seed(1)
    V = model.config.vocab_size
    prompts, responses, attn, input_ids, position_ids, response_mask = padded_batch(
        prompt_lens, resp_lens, P, R, V, gen)

    def forward():
        # The actor's forward as verl's engine returns it: nested (no-padding) per-token log-probs/entropies.
        logits = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids).logits
        lp = logprobs_from_logits(logits[:, :-1], input_ids[:, 1:])
        ent = entropy_from_logits(logits[:, :-1])
        pad = lambda x: torch.cat([x, torch.zeros(B, 1)], 1)  # position j holds token j+1's value, as verl's roll
        lp, ent = pad(lp), pad(ent)
        keep = attn.bool()
        lens = attn.sum(1)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
        nest = lambda x: torch.nested.nested_tensor_from_jagged(x[keep], offsets=offsets)
        dense = lambda x: torch.stack(
            [torch.nn.functional.pad(x[i, P - 1:P - 1 + resp_lens[i]], (0, R - resp_lens[i])) for i in range(B)])
        dense_lp, dense_ent = dense(lp), dense(ent)
        return {"log_probs": nest(lp), "entropy": nest(ent)}, dense_lp, dense_ent

    with torch.no_grad():
        _, lp0, ent0 = forward()
    old = (lp0 + 0.1 * torch.randn(B, R, generator=gen)) * response_mask
    old_ent = (ent0 + 0.3 * torch.rand(B, R, generator=gen)) * response_mask  # some tokens with H < H_old
    adv = torch.tensor([1.0, -0.5, 0.7, 0.3]).unsqueeze(-1).expand(B, R) * response_mask
    w = (torch.rand(B, R, generator=gen) * 1.5 + 0.25) * response_mask   # IS weights, zero on padding like verl's
    keep_mask = response_mask.clone()
    keep_mask[1, :] = 0  # a rejected row: verl's rejection modes AND their rejection into response_mask

    def batch(mask, **extra):
        td = TensorDict({"prompts": prompts, "responses": responses, "input_ids": input_ids.clone(),
                         "attention_mask": attn,
                         "position_ids": position_ids, "response_mask": mask, "old_log_probs": old, "advantages": adv,
                         **extra}, batch_size=[B])
        td = left_right_2_no_padding(td)  # verl's driver-side conversion before update_actor
        tu.assign_non_tensor(td, global_batch_size=B, use_dynamic_bsz=False, micro_batch_size_per_gpu=2)
        # what FSDPEngine.forward_backward_batch adds (one data-parallel rank)
        tu.assign_non_tensor(td, batch_num_tokens=int(td["loss_mask"].sum()), dp_size=1)
        return td

    def actor_config(policy_loss, agg="token-mean", **kw):
        pl = {"_target_": "tepo.integrations.verl.TepoPolicyLossConfig", **policy_loss}
        return omega_conf_to_dataclass(OmegaConf.create({"_target_": "verl.workers.config.FSDPActorConfig",
            "strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": 2, "loss_agg_mode": agg,
            "policy_loss": pl, **kw}))

    def run_verl(loss_fn, td):
        # verl's micro-batch loop (prepare_micro_batches + loss + backward per micro-batch), gradients summed.
        model.zero_grad(set_to_none=True)
        micro, _ = prepare_micro_batches(td)
        total, metrics = 0.0, []
        for mb in micro:
            out, _, _ = forward_mb(mb)
            loss, m = loss_fn(model_output=out, data=mb)
            loss.backward()
            total += float(loss.detach()); metrics.append(m)
        return total, {n: p.grad.clone() for n, p in params.items()}, len(micro), metrics

    def forward_mb(mb):
        # The actor forward of one micro-batch: the full forward's rows of this micro-batch (model in eval mode).
        full, _, _ = forward()
        idx = mb_rows(mb)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), attn[idx].sum(1).cumsum(0)])
        rows = lambda key: torch.nested.nested_tensor_from_jagged(
            torch.cat([full[key][i] for i in idx]), offsets=offsets)
        lp, en = rows("log_probs"), rows("entropy")
        return {"log_probs": lp, "entropy": en}, None, None

    def mb_rows(mb):
        # rows of the mini-batch in this micro-batch, found by their prompt tokens
        return [next(i for i in range(B) if torch.equal(prompts[i], mb["prompts"][j])) for j in range(mb.batch_size[0])]

    def run_ours(name, mask, **kw):
        model.zero_grad(set_to_none=True)
        _, lp, ent = forward()
        loss, metrics = compute_policy_loss(name, logp=lp, old_logp=old, advantages=adv, mask=mask.bool(),
                                            entropy=ent if kw.get("tepo_kl_mask_coef") else None, **kw)
        loss.backward()
        return float(loss.detach()), {n: p.grad.clone() for n, p in params.items()}, metrics

    def close(a, b, what):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-7, msg=what)

    report = {}
    # 1. rollout_is_weights + rejection: tepo's dapo == verl's vanilla (token-level clip; dual clip inactive here)
    td = batch(keep_mask, rollout_is_weights=w)
    cfg_dapo = actor_config({"loss_mode": "dapo", "eps": 0.2})
    cfg_vanilla = actor_config({"loss_mode": "vanilla"}, clip_ratio=0.2, clip_ratio_c=10.0)
    v_dapo, g_dapo, n_micro, _ = run_verl(partial(ppo_loss, config=cfg_dapo), td)
    v_van, g_van, _, _ = run_verl(partial(ppo_loss, config=cfg_vanilla), batch(keep_mask, rollout_is_weights=w))
    v_ours, g_ours, _ = run_ours("dapo", keep_mask, eps=0.2, agg="token-mean", is_weights=w)
    close(v_dapo, v_ours, "dapo value"); close(v_van, v_ours, "vanilla value")
    for n in params:
        torch.testing.assert_close(g_dapo[n], g_ours[n], rtol=1e-4, atol=1e-8, msg=f"dapo grad {n}")
        torch.testing.assert_close(g_van[n], g_ours[n], rtol=1e-4, atol=1e-8, msg=f"vanilla grad {n}")
    v_now, _, _ = run_ours("dapo", keep_mask, eps=0.2, agg="token-mean")
    assert abs(v_now - v_ours) > 1e-4, "weights changed nothing"
    report["is_weights"] = {"value": v_ours, "micro_batches": n_micro}

    # 2. TEPO v2: tepo_kl_mask_coef through tepo_ppo_loss (H from the forward, H_old from the batch)
    coef = 0.5
    cfg_v2 = actor_config({"loss_mode": "tepo", "eps": 0.2, "tepo_kl_mask_coef": coef}, calculate_entropy=True)
    td2 = batch(response_mask, **{OLD_ENTROPY_KEY: old_ent})
    v_v2, g_v2, n_micro, metrics = run_verl(partial(tepo_ppo_loss, config=cfg_v2), td2)
    o_v2, go_v2, om = run_ours("tepo", response_mask, eps=0.2, agg="token-mean", old_entropy=old_ent,
                               tepo_kl_mask_coef=coef, num_tokens=int(response_mask.sum()))
    close(v_v2, o_v2, "tepo v2 value")
    for n in params:
        torch.testing.assert_close(g_v2[n], go_v2[n], rtol=1e-4, atol=1e-8, msg=f"tepo v2 grad {n}")
    o_v1, _, _ = run_ours("tepo", response_mask, eps=0.2, agg="token-mean")
    assert om["tepo_kl_mask_frac"] > 0 and abs(o_v2 - o_v1) > 1e-6, (om, o_v1, o_v2)
    report["tepo_v2"] = {"value": o_v2, "mask_term": om["tepo_kl_mask"], "mask_frac": om["tepo_kl_mask_frac"],
                         "micro_batches": n_micro}

    # 2b. H_old where verl's v1 driver keeps it: the per-response (nested) field "entropy" of the update's batch
    nested_mask = torch.nested.as_nested_tensor(
        [response_mask[i, :resp_lens[i]] for i in range(B)], layout=torch.jagged)
    td2b = batch(response_mask, entropy=response_to_nested(old_ent, nested_mask))
    v_v2b, g_v2b, _, _ = run_verl(partial(tepo_ppo_loss, config=cfg_v2), td2b)
    close(v_v2b, o_v2, "tepo v2 value, v1 layout")
    for n in params:
        torch.testing.assert_close(g_v2b[n], go_v2[n], rtol=1e-4, atol=1e-8, msg=f"tepo v2 grad {n}, v1 layout")
    report["tepo_v2"]["v1_layout"] = True

    # 2c. the masked term's estimator (policy_loss.tepo_kl_mask_estimator) reaches the loss
    cfg_k2 = actor_config({"loss_mode": "tepo", "eps": 0.2, "tepo_kl_mask_coef": coef,
                           "tepo_kl_mask_estimator": "k2"}, calculate_entropy=True)
    v_k2, g_k2, _, _ = run_verl(partial(tepo_ppo_loss, config=cfg_k2), td2)
    o_k2, go_k2, om_k2 = run_ours("tepo", response_mask, eps=0.2, agg="token-mean", old_entropy=old_ent,
                                  tepo_kl_mask_coef=coef, tepo_kl_mask_estimator="k2",
                                  num_tokens=int(response_mask.sum()))
    close(v_k2, o_k2, "tepo v2 k2 value")
    for n in params:
        torch.testing.assert_close(g_k2[n], go_k2[n], rtol=1e-4, atol=1e-8, msg=f"tepo v2 k2 grad {n}")
    report["tepo_v2"]["k2_mask_term"] = om_k2["tepo_kl_mask"]

    # 3. verl's plain ppo_loss cannot feed the mask: refused, not dropped
    try:
        run_verl(partial(ppo_loss, config=cfg_v2), batch(response_mask, **{OLD_ENTROPY_KEY: old_ent}))
    except ValueError as exc:
        report["plain_ppo_loss_error"] = str(exc)
    else:
        raise AssertionError("tepo_kl_mask_coef ran without entropies")

    # 4. Where verl's own actor worker stops on a CPU-only machine (the test asserts these stay the known stops).
    import os, traceback
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    from hydra import compose, initialize_config_dir
    import pathlib
    from verl.workers.engine_workers import ActorRolloutRefWorker

    def last_frame(exc):
        frame = traceback.extract_tb(exc.__traceback__)
        verl_frames = [f for f in frame if "/verl/" in f.filename]
        f = verl_frames[-1]
        return {"file": f.filename.split("site-packages/")[-1], "line": f.lineno,
                "error": f"{type(exc).__name__}: {exc}"}

    verl_configs = str(pathlib.Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=verl_configs, version_base=None):
        trainer_cfg = compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={sys.argv[1]}", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.n=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1"])
    OmegaConf.resolve(trainer_cfg)
    stops = {}
    for label in ("as verl starts it", "gloo process group made first"):
        if label == "gloo process group made first":
            torch.distributed.init_process_group("gloo", rank=0, world_size=1)
        try:
            ActorRolloutRefWorker(trainer_cfg.actor_rollout_ref, role="actor").init_model()
        except Exception as exc:  # verl's own failure, reported as is
            stops[label] = last_frame(exc)
        else:
            stops[label] = None
    report["cpu_stops"] = stops
    print(json.dumps(report))
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_verl_actor_loss_path_on_a_real_forward(verl_python, embedded_model_dir, tmp_path):
    report = run_verl_script(
        verl_python,
        tmp_path,
        ACTOR_SCRIPT,
        embedded_model_dir,
        _free_port(),
        name="actor_check.py",
        timeout=1200,
        env=verl_env(PYTHONPATH=str(ROOT / "tests")),  # for tests/verl_batch.py
    )
    assert report["is_weights"]["micro_batches"] == 2
    assert report["tepo_v2"]["micro_batches"] == 2 and report["tepo_v2"]["v1_layout"]
    assert 0 < report["tepo_v2"]["mask_frac"] < 1 and report["tepo_v2"]["mask_term"] > 0
    assert report["tepo_v2"]["k2_mask_term"] > 0
    assert report["tepo_v2"]["k2_mask_term"] != pytest.approx(report["tepo_v2"]["mask_term"], rel=1e-3)
    assert "tepo_ppo_loss" in report["plain_ppo_loss_error"]
    stops = report["cpu_stops"]
    assert stops["as verl starts it"]["file"] == "verl/utils/distributed.py", stops
    assert "NCCL" in stops["as verl starts it"]["error"], stops
    assert stops["gloo process group made first"]["file"] == "verl/workers/engine/fsdp/utils.py", stops
    assert "_cuda_setDevice" in stops["gloo process group made first"]["error"], stops
