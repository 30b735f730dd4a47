"""Run inside the Megatron-Core venv: build a real ``GPTModel`` on the CPU, load ``to-megatron`` output strictly.

Not a test module (``tests/engines/test_megatron.py`` runs it with the engine's own Python); it imports
nothing from fp4convert. Megatron-Core 0.16.1 builds its local (non-TransformerEngine) spec on the
CPU under a one-process gloo group with small shims: ``torch.cuda.current_device`` answers "cpu"
(the model's constructors ask for it even with ``use_cpu_initialization``), the RNG tracker's
``fork`` is a no-op (it guards dropout, which is 0), the causal mask is passed in (the default one
is made on "cuda"), MoE layers use the ``allgather`` token dispatcher, 0.16.1's undefined
TransformerEngine placeholder in the fp32 router (``moe_utils.te_general_gemm``) is set to None, and
for MLA the local ``DotProductAttention`` accepts the ``k_channels`` / ``v_channels`` MLA passes (and
sizes its output by ``v_channels``) while MLA's TransformerEngine flag is corrected to "absent".
Nothing of Megatron's arithmetic is replaced.

Usage: ``python megatron_probe.py HF_DIR MEGATRON_DIR OUT [REFERENCE_DIR]`` (REFERENCE_DIR: the folder
transformers loads for the reference logits, when HF_DIR is in a layout it cannot read; default
HF_DIR). Writes into OUT:

- ``named_parameters.safetensors`` plus ``order.json``: ``model.named_parameters()`` of the BF16 model
  after ``load_state_dict(strict=True)`` (then the routers' ``expert_bias`` buffers), names as the
  live model spells them, in its order;
- ``logits.safetensors``: float32 logits of Megatron (``megatron``) and of transformers
  (``transformers``) on the same prompt, both models in float32 from the same BF16 weights.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PROMPT = [[1, 17, 33, 5, 90, 64, 2, 101, 7, 7, 120, 3]]


def _init() -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.current_device = lambda: "cpu"  # the constructors ask even with use_cpu_initialization
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)
    import contextlib

    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    # The tracker forks CUDA RNG states around attention dropout (0 here): a no-op fork on the CPU.
    get_cuda_rng_tracker().fork = lambda *args, **kwargs: contextlib.nullcontext()
    from megatron.core.transformer.moe import moe_utils

    # 0.16.1 names TransformerEngine's GEMM in the fp32 router without defining it when TE is absent.
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    # MLA builds its core attention with k_channels / v_channels (q/k heads of nope + rope dims, v heads
    # of v_head_dim), which 0.16.1's local DotProductAttention does not take: its matmuls already
    # follow the tensors' head sizes, only the output width (heads x v_head_dim) has to be told.
    plain_init = DotProductAttention.__init__

    def init_with_channels(self, *args, k_channels=None, v_channels=None, **kwargs):  # type: ignore[no-untyped-def]
        plain_init(self, *args, **kwargs)
        if v_channels is not None:
            self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

    DotProductAttention.__init__ = init_with_channels
    # 0.16.1's MLA believes TransformerEngine is present when its TE-less extension module imports
    # (which stands mock classes in for TE's), then tests isinstance against the mock TELinear.
    import importlib.util

    from megatron.core.transformer import multi_latent_attention

    if importlib.util.find_spec("transformer_engine") is None:
        multi_latent_attention.HAVE_TE = False


def _config(hf: dict, dtype):
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    heads = hf["num_attention_heads"]
    kwargs = {
        "num_layers": hf["num_hidden_layers"],
        "hidden_size": hf["hidden_size"],
        "num_attention_heads": heads,
        "ffn_hidden_size": hf["intermediate_size"],
        "normalization": "RMSNorm",
        "layernorm_epsilon": hf.get("rms_norm_eps", 1e-6),
        "gated_linear_unit": True,
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": False,
        "add_qkv_bias": bool(hf.get("attention_bias", False)),
        "use_cpu_initialization": True,
        "perform_initialization": False,
        "params_dtype": dtype,
        "bf16": dtype == torch.bfloat16,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "persist_layer_norm": False,
        "bias_dropout_fusion": False,
        "apply_rope_fusion": False,
        "masked_softmax_fusion": False,
        "gradient_accumulation_fusion": False,
    }
    model_type = hf["model_type"]
    layers = hf["num_hidden_layers"]
    kwargs["num_query_groups"] = hf.get("num_key_value_heads", heads)
    kwargs["kv_channels"] = hf.get("head_dim") or hf["hidden_size"] // heads
    if model_type in ("qwen3", "qwen3_moe") or (model_type == "glm4_moe" and hf.get("use_qk_norm")):
        kwargs["qk_layernorm"] = True
    if model_type == "qwen2_moe":
        kwargs["add_qkv_bias"] = bool(hf.get("qkv_bias", True))
    moe = {
        "moe_router_topk": hf.get("num_experts_per_tok"),
        "moe_token_dispatcher_type": "allgather",
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_router_dtype": "fp32",
    }
    if model_type in ("qwen3_moe", "qwen2_moe"):
        sparse = hf.get("decoder_sparse_step", 1)
        dense = set(hf.get("mlp_only_layers", []))
        kwargs |= moe | {
            "num_moe_experts": hf.get("num_experts") or hf["num_local_experts"],
            "moe_ffn_hidden_size": hf["moe_intermediate_size"],
            "moe_router_score_function": "softmax",
            "moe_router_pre_softmax": not hf.get("norm_topk_prob", True),
            "moe_layer_freq": [int(i not in dense and (i + 1) % sparse == 0) for i in range(layers)],
        }
    if model_type == "qwen2_moe":  # one shared expert scaled by sigmoid(shared_expert_gate(x))
        kwargs["moe_shared_expert_intermediate_size"] = hf["shared_expert_intermediate_size"]
        kwargs["moe_shared_expert_gate"] = True
    if model_type == "mixtral":  # softmax over the top-k logits = Mixtral's renormalised top-k softmax
        kwargs |= moe | {
            "num_moe_experts": hf["num_local_experts"],
            "moe_ffn_hidden_size": hf["intermediate_size"],
            "moe_router_score_function": "softmax",
            "moe_router_pre_softmax": False,
        }
    if model_type == "glm4_moe":  # sigmoid scores, bias-corrected choice, normalised top-k weights
        first_dense = hf["first_k_dense_replace"]
        kwargs |= moe | {
            "num_moe_experts": hf["n_routed_experts"],
            "moe_ffn_hidden_size": hf["moe_intermediate_size"],
            "moe_shared_expert_intermediate_size": hf["moe_intermediate_size"] * hf["n_shared_experts"],
            "moe_router_score_function": "sigmoid",
            "moe_router_enable_expert_bias": True,
            "moe_router_topk_scaling_factor": hf.get("routed_scaling_factor", 1.0),
            "moe_router_pre_softmax": False,
            "moe_layer_freq": [int(i >= first_dense) for i in range(layers)],
            "add_qkv_bias": bool(hf.get("attention_bias", False)),
        }
    if model_type in ("deepseek_v3", "kimi_k2"):  # MLA with q-LoRA; sigmoid routing with expert bias
        first_dense = hf["first_k_dense_replace"]
        rope = hf.get("rope_parameters") or {}
        kwargs |= moe | {
            "num_query_groups": heads,
            "kv_channels": None,
            "qk_layernorm": True,  # MLA's q_layernorm / kv_layernorm
            "q_lora_rank": hf["q_lora_rank"],
            "kv_lora_rank": hf["kv_lora_rank"],
            "qk_head_dim": hf["qk_nope_head_dim"],
            "qk_pos_emb_head_dim": hf["qk_rope_head_dim"],
            "v_head_dim": hf["v_head_dim"],
            "rope_type": "rope",
            "rotary_base": float(rope.get("rope_theta", hf.get("rope_theta", 10000))),
            "num_moe_experts": hf["n_routed_experts"],
            "moe_ffn_hidden_size": hf["moe_intermediate_size"],
            "moe_shared_expert_intermediate_size": hf["moe_intermediate_size"] * hf["n_shared_experts"],
            "moe_router_score_function": "sigmoid",
            "moe_router_enable_expert_bias": True,
            "moe_router_topk_scaling_factor": hf.get("routed_scaling_factor", 1.0),
            "moe_router_num_groups": hf.get("n_group"),
            "moe_router_group_topk": hf.get("topk_group"),
            "moe_router_pre_softmax": False,
            "moe_layer_freq": [int(i >= first_dense) for i in range(layers)],
        }
        return MLATransformerConfig(**kwargs)
    if model_type == "gpt_oss":  # Megatron-Bridge gpt_oss_bridge.py's settings
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        kwargs |= moe | {
            "num_moe_experts": hf["num_local_experts"],
            "moe_ffn_hidden_size": hf["intermediate_size"],
            "moe_router_score_function": "softmax",
            "moe_router_pre_softmax": False,
            "add_bias_linear": True,
            "add_qkv_bias": True,
            "activation_func": quick_gelu,  # x * sigmoid(1.702 x), gpt-oss's swiglu_alpha
            "glu_linear_offset": 1.0,
            "activation_func_clamp_value": hf["swiglu_limit"],
            "bias_activation_fusion": False,
            "softmax_type": "learnable",
        }
    return TransformerConfig(**kwargs)


def _model(hf: dict, dtype):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec

    config = _config(hf, dtype)
    if config.num_moe_experts:
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    else:
        spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm)
    rope = hf.get("rope_parameters") or {}
    rotary_percent = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))  # GLM: 0.5
    return GPTModel(
        rotary_percent=float(rotary_percent),
        config=config,
        transformer_layer_spec=spec,
        vocab_size=hf["vocab_size"],
        max_sequence_length=hf["max_position_embeddings"],
        position_embedding_type="rope",
        rotary_base=int(rope.get("rope_theta", hf.get("rope_theta", 10000))),
        share_embeddings_and_output_weights=bool(hf.get("tie_word_embeddings", False)),
    )


def main() -> int:
    import torch
    from safetensors.torch import load_file, save_file

    hf_dir, megatron_dir, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    reference_dir = Path(sys.argv[4]) if len(sys.argv) > 4 else hf_dir
    out.mkdir(parents=True, exist_ok=True)
    hf = json.loads((hf_dir / "config.json").read_text())
    _init()
    state = {}
    for path in sorted(megatron_dir.glob("*.safetensors")):
        state.update(load_file(str(path)))

    model = _model(hf, torch.bfloat16)
    # `_extra_state` entries are module metadata, not weights (strict loading lets them be absent)
    expected = {name for name in model.state_dict() if not name.endswith("._extra_state")}
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    model.load_state_dict(state, strict=True)  # raises on any missing or unexpected name
    # The router's aux-loss-free expert_bias is a persistent buffer, not a parameter; RL exporters
    # send it with the parameters (Miles' named_params_and_buffers), so it follows them here.
    named = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if n.endswith(".expert_bias")]
    save_file({n: p.detach().contiguous() for n, p in named}, str(out / "named_parameters.safetensors"))
    (out / "order.json").write_text(
        json.dumps({"order": [n for n, _ in named], "missing": missing, "unexpected": unexpected})
    )

    model = _model(hf, torch.float32)  # the same BF16 weights, computed in float32 like the reference
    model.load_state_dict(state, strict=True)
    model.eval()
    tokens = torch.tensor(PROMPT)
    positions = torch.arange(tokens.shape[1]).unsqueeze(0)
    # Megatron's default causal mask is made on "cuda"; give it the same mask (True = masked) on the CPU.
    causal = torch.triu(torch.ones(tokens.shape[1], tokens.shape[1]), diagonal=1).bool()[None, None]
    with torch.no_grad():
        logits = model(tokens, positions, attention_mask=causal)
    import transformers

    reference = transformers.AutoModelForCausalLM.from_pretrained(str(reference_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        expected_logits = reference(tokens).logits
    save_file(
        {"megatron": logits.float().contiguous(), "transformers": expected_logits.float().contiguous()},
        str(out / "logits.safetensors"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
