"""The hardware and model catalogs in data/: every entry loads, carries a source, and agrees with its citation.

Model entries describe architectures, never counts; the count they imply is checked here against the
count the authors publish (exact where one is published, within the rounding of the figure otherwise).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from zerotune.predictor.catalog import data_dir, list_hardware, list_models, load_hardware, load_model

REQUIRED_HARDWARE = {"v100-16gb", "v100-32gb", "a100-40gb", "a100-80gb", "h100-80gb", "h200", "gaudi", "gaudi2",
                     "cpu"}
REQUIRED_MODELS = {"distilbert-base", "bert-base", "bert-large", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
                   "deberta-v2-xlarge", "deberta-v2-xxlarge", "gpt-neo-1.3b", "gpt-neo-2.7b", "megatron-gpt-1.3b",
                   "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b"}

EXACT = 1e-6
# Models whose published size is a rounded figure: relative tolerance, and where the figure comes from.
# Every other model must match its published exact count (num_parameters() of the Hugging Face model).
ROUNDED_TOLERANCE = {
    # model card (huggingface.co/microsoft/deberta-v2-xlarge): "The total parameters are 900M"; 884.6M by architecture
    "deberta-v2-xlarge": 0.02,
    # model card (huggingface.co/microsoft/deberta-v2-xxlarge): "Total parameters 1.5B", a figure rounded *down*:
    # the architecture gives 1.5645B, and the 3.14 GB fp16 checkpoint on the same repository holds ~1.57B values.
    "deberta-v2-xxlarge": 0.05,
    # GPT-3 XL size as trained with Megatron-LM (Brown et al. 2020, Table 2.1: "1.3B"); 1.3158B with the vocab
    # padded to 50304 as Megatron allocates it.
    "megatron-gpt-1.3b": 0.02,
}

HW_NUMBER_KEYS = ("memory_gib", "runtime_reserved_gib", "fp32_tflops", "memory_bandwidth_gb_per_s",
                  "intra_node_bandwidth_gb_per_s", "intra_node_latency_us", "inter_node_bandwidth_gb_per_s",
                  "inter_node_latency_us", "host_to_device_gb_per_s", "gpus_per_node", "host_memory_gib")


def _doc(kind: str, name: str) -> dict:
    return yaml.safe_load((data_dir() / kind / f"{name}.yaml").read_text())


# -- presence -------------------------------------------------------------------------------------------

def test_required_hardware_present() -> None:
    assert REQUIRED_HARDWARE <= set(list_hardware()), REQUIRED_HARDWARE - set(list_hardware())


def test_required_models_present() -> None:
    assert REQUIRED_MODELS <= set(list_models()), REQUIRED_MODELS - set(list_models())


@pytest.mark.parametrize("kind, names", [("hardware", list_hardware()), ("models", list_models())])
def test_file_stem_is_name(kind: str, names: list[str]) -> None:
    for name in names:
        assert _doc(kind, name)["name"] == name


# -- hardware ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list_hardware())
def test_hardware_numbers_are_numbers(name: str) -> None:
    # yaml reads '989e12' as a string; the loader rejects it, and this names the key that does it.
    doc = _doc("hardware", name)
    for key in HW_NUMBER_KEYS + ("fp16_tflops", "bf16_tflops"):
        value = doc.get(key)
        if key in ("fp16_tflops", "bf16_tflops") and value is None:
            continue
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{name}: {key} = {value!r}"
        assert math.isfinite(value) and value >= 0, f"{name}: {key} = {value!r}"


@pytest.mark.parametrize("name", list_hardware())
def test_hardware_loads_with_sane_values(name: str) -> None:
    hw = load_hardware(name)
    assert hw.name == name
    assert hw.source.strip()
    memory_gib = hw.memory_bytes / 2**30
    assert 8 <= memory_gib <= 512, memory_gib  # from a 16 GB V100 to a 141 GB H200, or a dev box's RAM
    assert 0 <= hw.runtime_reserved_bytes < 0.1 * hw.memory_bytes
    assert hw.host_memory_bytes >= hw.memory_bytes or hw.kind == "cpu"
    assert hw.num_devices_per_node >= 1
    assert "fp32" in hw.peak_flops
    for rate in (hw.memory_bandwidth_bytes_per_s, hw.intra_node_bandwidth_bytes_per_s,
                 hw.inter_node_bandwidth_bytes_per_s, hw.host_to_device_bandwidth_bytes_per_s):
        assert rate > 0
    assert hw.intra_node_latency_s > 0 and hw.inter_node_latency_s > 0


@pytest.mark.parametrize("name", list_hardware())
def test_half_precision_peak_at_least_fp32(name: str) -> None:
    hw = load_hardware(name)
    for precision in ("fp16", "bf16"):
        if hw.supports(precision):
            assert hw.peak_flops[precision] >= hw.peak_flops["fp32"], precision


def test_volta_has_no_bf16() -> None:
    # V100 datasheet: tensor cores run fp16 only; bf16 arrived with Ampere.
    for name in ("v100-16gb", "v100-32gb"):
        assert not load_hardware(name).supports("bf16")


def test_published_peaks() -> None:
    # NVIDIA datasheets, dense tensor-core figures (stas00/ml-engineering tables): A100 312, H100/H200 989 TFLOPS.
    assert load_hardware("a100-80gb").peak_flops["bf16"] == pytest.approx(312e12)
    assert load_hardware("h100-80gb").peak_flops["bf16"] == pytest.approx(989e12)
    assert load_hardware("h200").peak_flops["bf16"] == pytest.approx(989e12)
    assert load_hardware("v100-32gb").peak_flops["fp16"] == pytest.approx(125e12)
    # the newer entries take peak and measured MAMF from shared/data/public/hardware_reference.csv (stas00 tables)
    assert load_hardware("b200").peak_flops["bf16"] == pytest.approx(2250e12)
    assert load_hardware("b200").matmul_flops["bf16"] == pytest.approx(1745e12)
    assert load_hardware("mi300x").peak_flops["bf16"] == pytest.approx(1300e12)
    assert load_hardware("mi300x").matmul_flops["bf16"] == pytest.approx(668.4e12)
    assert load_hardware("gaudi3").peak_flops["bf16"] == pytest.approx(1677e12)
    assert load_hardware("gaudi3").matmul_flops["bf16"] == pytest.approx(1243e12)
    assert load_hardware("gh200").peak_flops["bf16"] == pytest.approx(989e12)
    assert load_hardware("gh200").matmul_flops["bf16"] == pytest.approx(828.6e12)


def test_gh200_reaches_its_cpu_memory_over_nvlink_c2c() -> None:
    # NVIDIA GH200 datasheet: NVLink-C2C at 900 GB/s bidirectional, about 7x PCIe 5.0 x16 (64 GB/s one way), so an
    # offloaded optimizer's transfers cost a GH200 a seventh of what they cost an H100 in a DGX
    gh200, h100 = load_hardware("gh200"), load_hardware("h100-80gb")
    assert gh200.host_to_device_bandwidth_bytes_per_s == pytest.approx(450e9)
    assert gh200.host_to_device_bandwidth_bytes_per_s > 7 * h100.host_to_device_bandwidth_bytes_per_s
    assert gh200.num_devices_per_node == 4


# -- models --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list_models())
def test_model_loads_with_source(name: str) -> None:
    model = load_model(name)
    assert model.name == name
    assert model.source.strip()
    assert model.published_num_params > 0, "every catalog model cites a published size"


@pytest.mark.parametrize("name", list_models())
def test_num_params_matches_published(name: str) -> None:
    model = load_model(name)
    tolerance = ROUNDED_TOLERANCE.get(name, EXACT)
    assert model.num_params == pytest.approx(model.published_num_params, rel=tolerance), (
        f"{name}: architecture gives {model.num_params:,}, published {model.published_num_params:,}")


def test_rounded_entries_are_in_catalog() -> None:
    assert set(ROUNDED_TOLERANCE) <= set(list_models())


# -- Hugging Face config.json, as the Hub publishes it ---------------------------------------------------

GPT2_CONFIG = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
    "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None,
    "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
    "summary_use_proj": True, "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}  # https://huggingface.co/openai-community/gpt2/blob/main/config.json

LLAMA2_7B_CONFIG = {
    "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"], "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.31.0.dev0", "use_cache": True, "vocab_size": 32000,
}  # https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json

LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
    "use_cache": True, "vocab_size": 128256,
}  # https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json (grouped-query attention)

HF_CASES = [("gpt2", GPT2_CONFIG), ("llama-2-7b", LLAMA2_7B_CONFIG), ("llama-3-8b", LLAMA3_8B_CONFIG)]
ARCHITECTURE_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
                       "max_position_embeddings", "position_embedding", "tied_embeddings", "gated_mlp", "norm",
                       "qkv_bias", "out_bias", "mlp_bias", "dropout", "type_vocab_size", "embedding_norm",
                       "final_norm", "head", "relative_position_buckets", "conv_kernel_size")


def _write_config(tmp_path: Path, name: str, config: dict) -> Path:
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config, indent=2))
    return path


@pytest.mark.parametrize("name, config", HF_CASES, ids=[name for name, _ in HF_CASES])
def test_hf_config_gives_catalog_num_params(tmp_path: Path, name: str, config: dict) -> None:
    from_hf = load_model(str(_write_config(tmp_path, name, config)))
    assert from_hf.num_params == load_model(name).num_params == load_model(name).published_num_params


@pytest.mark.parametrize("name, config", HF_CASES, ids=[name for name, _ in HF_CASES])
def test_hf_config_gives_catalog_architecture(tmp_path: Path, name: str, config: dict) -> None:
    # Same count is not enough: the tensors ZeRO-3 partitions and the activations must follow the same shape.
    from_hf = load_model(str(_write_config(tmp_path, name, config)))
    catalog = load_model(name)
    for field in ARCHITECTURE_FIELDS:
        assert getattr(from_hf, field) == getattr(catalog, field), field


PYTHIA_160M_CONFIG = {
    "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 12, "num_hidden_layers": 12,
    "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False, "torch_dtype": "float16",
    "use_cache": True, "use_parallel_residual": True, "vocab_size": 50304,
}  # https://huggingface.co/EleutherAI/pythia-160m/blob/main/config.json

BLOOM_560M_CONFIG = {
    "apply_residual_connection_post_layernorm": False, "attention_dropout": 0.0, "architectures": ["BloomForCausalLM"],
    "attention_softmax_in_fp32": True, "bos_token_id": 1, "eos_token_id": 2, "hidden_dropout": 0.0,
    "hidden_size": 1024, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "masked_softmax_fusion": True,
    "model_type": "bloom", "n_head": 16, "n_inner": None, "n_layer": 24, "offset_alibi": 100, "pad_token_id": 3,
    "pretraining_tp": 1, "skip_bias_add": True, "slow_but_exact": False, "unk_token_id": 0, "use_cache": True,
    "vocab_size": 250880,
}  # https://huggingface.co/bigscience/bloom-560m/blob/main/config.json


@pytest.mark.parametrize("name, config, published, positions", [
    # Pythia's README table (github.com/EleutherAI/pythia): 160M has 162,322,944 parameters in all; rotary positions
    # (rotary_pct), so no position table, and an untied output matrix.
    ("pythia-160m", PYTHIA_160M_CONFIG, 162_322_944, "rotary"),
    # bigscience/bloom-560m's model card: 559,214,592 parameters; ALiBi positions (no table), a norm after the
    # word embeddings.
    ("bloom-560m", BLOOM_560M_CONFIG, 559_214_592, "none"),
], ids=["pythia-160m", "bloom-560m"])
def test_hf_config_of_a_family_outside_the_catalog_gives_the_published_count(
        tmp_path: Path, name: str, config: dict, published: int, positions: str) -> None:
    spec = load_model(str(_write_config(tmp_path, name, config)))
    assert spec.num_params == published
    assert spec.position_embedding == positions


def test_hf_config_of_an_encoder_decoder_counts_both_stacks(tmp_path: Path) -> None:
    # T5 names the encoder's depth num_layers and the decoder's num_decoder_layers (t5-small: 6 + 6); BART names
    # encoder_layers / decoder_layers and encoder_attention_heads. A token passes through both stacks.
    t5 = {"model_type": "t5", "is_encoder_decoder": True, "d_model": 512, "d_ff": 2048, "d_kv": 64, "num_heads": 8,
          "num_layers": 6, "num_decoder_layers": 6, "vocab_size": 32128, "relative_attention_num_buckets": 32,
          "feed_forward_proj": "relu"}
    bart = {"model_type": "bart", "is_encoder_decoder": True, "d_model": 768, "encoder_layers": 6, "decoder_layers": 6,
            "encoder_attention_heads": 12, "decoder_attention_heads": 12, "encoder_ffn_dim": 3072,
            "decoder_ffn_dim": 3072, "vocab_size": 50265, "max_position_embeddings": 1024}
    t5_spec, bart_spec = (load_model(str(_write_config(tmp_path, n, c))) for n, c in (("t5", t5), ("bart", bart)))
    assert (t5_spec.num_layers, t5_spec.ffn_hidden_size, t5_spec.position_embedding) == (12, 2048, "relative")
    assert (bart_spec.num_layers, bart_spec.num_heads, bart_spec.ffn_hidden_size) == (12, 12, 3072)


@pytest.mark.parametrize("proj, gated, d_model, heads", [("relu", False, 256, 4), ("gated-gelu", True, 512, 6)])
def test_hf_config_of_t5_has_no_biases_an_rms_norm_its_gate_and_its_cross_attention(
        tmp_path: Path, proj: str, gated: bool, d_model: int, heads: int) -> None:
    """transformers models/t5/modeling_t5.py: T5LayerNorm (no mean, no bias), every linear bias-free, and
    feed_forward_proj "gated-gelu" (T5 v1.1, mT5) runs wi_0 and wi_1. Each decoder block's cross-attention
    (T5LayerCrossAttention: a norm and q, k, v, o of heads x d_kv) is held: without it a T5 came out 11.6% under
    its module's count. flan-t5-small's shape (d_model 512, 6 heads of d_kv 64) was refused: 512 is no multiple of
    6."""
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(vocab_size=8000, d_model=d_model, d_kv=64, d_ff=1024, num_layers=4,
                                   num_decoder_layers=3, num_heads=heads, feed_forward_proj=proj)
    spec = load_model(str(_write_config(tmp_path, "t5", config.to_dict())))
    assert (spec.norm, spec.qkv_bias, spec.out_bias, spec.mlp_bias, spec.gated_mlp) == \
        ("rmsnorm", False, False, False, gated)
    assert (spec.num_layers, spec.cross_attention_layers, spec.q_dim) == (7, 3, heads * 64)
    real = transformers.T5ForConditionalGeneration(config)
    assert spec.num_params == pytest.approx(sum(p.numel() for p in real.parameters()), rel=1e-3)
    assert spec.largest_layer_params > spec.num_layer_params > spec.layer_tensors(0)[0].num_elems


def test_t5_forward_flops_with_cross_attention_are_torchs_count(tmp_path: Path) -> None:
    """At equal source and target lengths the one-stack description is exact: its forward FLOPs (blocks with the
    decoder's cross-attention, and the logits) are what torch's FlopCounterMode counts in the real model's forward
    (T5's attention is eager matmuls, counted). Without cross-attention they came out 10% under."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from zerotune.predictor.flops import micro_batch_flops
    config = transformers.T5Config(vocab_size=8000, d_model=256, d_kv=64, d_ff=1024, num_layers=4,
                                   num_decoder_layers=3, num_heads=4, decoder_start_token_id=0, pad_token_id=0)
    ids = torch.randint(3, 8000, (2, 64))
    with FlopCounterMode(display=False) as counter:
        transformers.T5ForConditionalGeneration(config)(input_ids=ids, decoder_input_ids=ids)
    spec = load_model(str(_write_config(tmp_path, "t5", config.to_dict())))
    assert micro_batch_flops(spec, 2, 64, False).forward_flops == pytest.approx(counter.get_total_flops(), rel=1e-3)


def test_hf_config_traits_stated_by_keys_not_by_family_name(tmp_path: Path) -> None:
    # transformers 5 writes rotary settings as rope_parameters; SiLU configs are the Llama lineage's SwiGLU MLP
    # (Qwen3, OLMo); Falcon's multi_query shares one key/value head.
    qwen3 = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
             "num_key_value_heads": 8, "intermediate_size": 3072, "vocab_size": 1000, "hidden_act": "silu",
             "max_position_embeddings": 40960, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}
    falcon = {"model_type": "falcon", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
              "vocab_size": 1000, "multi_query": True, "alibi": False, "new_decoder_architecture": False}
    q, f = (load_model(str(_write_config(tmp_path, n, c))) for n, c in (("qwen3", qwen3), ("falcon", falcon)))
    assert (q.position_embedding, q.gated_mlp, q.num_kv_heads) == ("rotary", True, 8)
    assert (f.num_kv_heads, f.gated_mlp) == (1, False)


def test_hf_config_of_gemma_2_is_a_gated_mlp_under_its_gelu(tmp_path: Path) -> None:
    # Gemma 2's MLP is gate_proj, up_proj, down_proj (transformers models/gemma2/modeling_gemma2.py Gemma2MLP) with
    # hidden_activation gelu_pytorch_tanh: no SiLU key says it is gated, its family does. Read as ungated, a small
    # Gemma 2 came out 15% under its module's parameter count (tests/test_profiled.py).
    gemma2 = {"model_type": "gemma2", "hidden_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 688, "vocab_size": 5000,
              "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "tie_word_embeddings": True}
    spec = load_model(str(_write_config(tmp_path, "gemma2", gemma2)))
    assert (spec.gated_mlp, spec.norm, spec.position_embedding, spec.num_kv_heads) == (True, "rmsnorm", "rotary", 2)


def test_hf_config_head_dim_sets_the_query_and_output_widths(tmp_path: Path) -> None:
    # Qwen3-0.6B (huggingface.co/Qwen/Qwen3-0.6B config.json): hidden 1024, 16 heads of head_dim 128, 8 key/value
    # heads; transformers models/qwen3/modeling_qwen3.py Qwen3Attention: q_proj 1024 -> 16 x 128, k/v_proj
    # 1024 -> 8 x 128, o_proj 16 x 128 -> 1024, no biases; RMSNorm; tied embeddings. Counted from those shapes the
    # model holds 596,042,752 parameters plus 28 x 2 x 128 of its q/k norms (not modelled); as hidden / heads it
    # came out 508,307,456 (15% under).
    qwen3 = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
             "max_position_embeddings": 40960, "hidden_act": "silu", "tie_word_embeddings": True,
             "rope_theta": 1000000, "attention_bias": False}
    spec = load_model(str(_write_config(tmp_path, "qwen3-0.6b", qwen3)))
    layer = {t.name.split(".", 2)[2]: t.num_elems for t in spec.layer_tensors(0)}
    assert (layer["attn.q.weight"], layer["attn.k.weight"], layer["attn.out.weight"]) == (
        1024 * 2048, 1024 * 1024, 2048 * 1024)
    assert spec.num_params + 28 * 2 * 128 == pytest.approx(596_049_920, abs=1)
    same = dict(qwen3, head_dim=64)  # equal to hidden / heads: nothing to state
    assert load_model(str(_write_config(tmp_path, "qwen3-64", same))).attention_head_dim == 0


@pytest.mark.parametrize("name", list_hardware())
def test_comm_compute_overlap_is_a_bool_with_a_source_where_stated(name: str) -> None:
    # Devices with streams overlap (the default); the CPU accelerator has none (accelerator/cpu_accelerator.py:42,
    # 117-134 in DeepSpeed 0.19.8), and a catalog entry that states the field says where it comes from.
    doc, hw = _doc("hardware", name), load_hardware(name)
    assert hw.comm_compute_overlap is (hw.kind != "cpu"), name
    if "comm_compute_overlap" in doc:
        assert isinstance(doc["comm_compute_overlap"], bool) and "deepspeed" in doc["comm_compute_overlap_source"].lower()


@pytest.mark.parametrize("value", ["'false'", "0", "1", "null", "maybe"])
def test_comm_compute_overlap_must_be_true_or_false(tmp_path: Path, value: str) -> None:
    text = (data_dir() / "hardware" / "cpu.yaml").read_text().replace("comm_compute_overlap: false",
                                                                      f"comm_compute_overlap: {value}")
    assert f"comm_compute_overlap: {value}\n" in text
    (tmp_path / "hw.yaml").write_text(text)
    with pytest.raises(ValueError, match=r"comm_compute_overlap must be true or false") as err:
        load_hardware(str(tmp_path / "hw.yaml"))
    assert "\n" not in str(err.value)


def test_comm_compute_overlap_defaults_to_true_when_left_out(tmp_path: Path) -> None:
    lines = (data_dir() / "hardware" / "cpu.yaml").read_text().splitlines()
    (tmp_path / "hw.yaml").write_text("\n".join(l for l in lines if not l.startswith("comm_compute_overlap")) + "\n")
    assert load_hardware(str(tmp_path / "hw.yaml")).comm_compute_overlap is True


@pytest.mark.parametrize("value, accepted", [("0.83", True), ("0", True), ("1", True), ("1.5", False), ("-0.1", False),
                                             ("'0.8'", False)])
def test_heap_retained_fraction_is_a_share_of_the_activations(tmp_path: Path, value: str, accepted: bool) -> None:
    # A fraction of the activations (data/measurements/cpu_heap_retention.json reads 0.62-0.83): a figure above 1
    # (a percentage, or bytes) or a quoted number is refused in one line naming the key.
    text = (data_dir() / "hardware" / "cpu.yaml").read_text().replace("heap_retained_activation_fraction: 0.83",
                                                                      f"heap_retained_activation_fraction: {value}")
    (tmp_path / "hw.yaml").write_text(text)
    if accepted:
        assert load_hardware(str(tmp_path / "hw.yaml")).heap_retained_activation_fraction == float(value)
        return
    with pytest.raises(ValueError, match=r"heap_retained_activation_fraction") as err:
        load_hardware(str(tmp_path / "hw.yaml"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", list_hardware())
def test_only_a_host_allocator_retains_freed_activations(name: str) -> None:
    # glibc's heap on a CPU rank keeps freed activations resident; a device's caching allocator is allocator_slack.
    doc, hw = _doc("hardware", name), load_hardware(name)
    assert (hw.heap_retained_activation_fraction > 0) is (hw.kind == "cpu"), name
    if "heap_retained_activation_fraction" in doc:
        assert "measured" in doc["heap_retained_source"].lower()


def test_a_model_without_tokens_has_no_vocabulary_head() -> None:
    # vocab_size 0 describes inputs that arrive as vectors (a ViT's patches); a vocabulary head needs a vocabulary
    from zerotune.predictor.model import ModelSpec
    spec = ModelSpec("v", 2, 64, 4, 4, 256, 0, 16, position_embedding="none", head="none", tied_embeddings=False)
    assert spec.num_params == 2 * (4 * 64 * 64 + 4 * 64 + 2 * 64 * 256 + 256 + 64 + 4 * 64) + 2 * 64
    with pytest.raises(ValueError, match="vocab_size must be positive for a vocabulary head"):
        ModelSpec("v", 2, 64, 4, 4, 256, 0, 16, head="lm")


def test_hf_config_of_a_sparse_moe_holds_every_expert_and_runs_top_k(tmp_path: Path) -> None:
    """Mixtral (transformers models/mixtral/modeling_mixtral.py: a router h -> experts and num_local_experts gated
    MLPs w1, w3: h -> f, w2: f -> h per block, a token routed to num_experts_per_tok of them). Read as one dense
    MLP, a 15.4M-parameter Mixtral came out at 4.4M (the 2026-11-26 Trainer probe); every expert is held, reduced
    and updated, and a token's FLOPs are its top-2 experts', not eight."""
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(vocab_size=4000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                        num_attention_heads=8, num_key_value_heads=4, num_local_experts=8,
                                        num_experts_per_tok=2, max_position_embeddings=512)
    spec = load_model(str(_write_config(tmp_path, "mixtral", config.to_dict())))
    assert (spec.num_experts, spec.experts_per_token, spec.ffn_hidden_size, spec.mlp_width) == (8, 2, 512, 1024)
    assert (spec.norm, spec.gated_mlp, spec.qkv_bias, spec.position_embedding) == ("rmsnorm", True, False, "rotary")
    real = transformers.MixtralForCausalLM(config)
    assert spec.num_params == pytest.approx(sum(p.numel() for p in real.parameters()), rel=1e-3)
    dense = load_model(str(_write_config(tmp_path, "dense", {**config.to_dict(), "num_local_experts": 0})))
    from zerotune.predictor.flops import layer_forward_flops
    # top-2 of 8: twice one expert's MLP FLOPs, a dense model's with a 2 x 512 MLP
    assert layer_forward_flops(spec, 1, 128) == layer_forward_flops(dense.replace(ffn_hidden_size=1024), 1, 128)


def test_hf_config_of_a_moe_with_a_shared_expert_counts_it(tmp_path: Path) -> None:
    """Qwen2-MoE runs a dense shared expert (shared_expert_intermediate_size, gated, with a one-output sigmoid gate)
    beside its routed experts (transformers models/qwen2_moe/modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock): left out,
    the default config (14.3B) came out 5.8% short; counted, exact, and every token runs its GEMMs."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2MoeConfig(vocab_size=4000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                         num_attention_heads=8, num_key_value_heads=4, num_experts=8,
                                         num_experts_per_tok=2, moe_intermediate_size=128,
                                         shared_expert_intermediate_size=384, max_position_embeddings=512)
    spec = load_model(str(_write_config(tmp_path, "qwen2moe", config.to_dict())))
    assert (spec.ffn_hidden_size, spec.shared_expert_ffn_size, spec.mlp_width) == (128, 384, 2 * 128 + 384)
    real = transformers.Qwen2MoeForCausalLM(config)
    assert spec.num_params == sum(p.numel() for p in real.parameters())


def test_hf_config_dropout_rates_of_zero_mean_no_dropout(tmp_path: Path) -> None:
    # GPT-NeoX (transformers GPTNeoXConfig: attention_dropout 0.0, hidden_dropout 0.0) was costed with dropout
    # kernels and masks; BERT's 0.1 rates keep them
    neox = {"model_type": "gpt_neox", "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 6,
            "intermediate_size": 1536, "vocab_size": 5000, "max_position_embeddings": 256, "rotary_pct": 0.25,
            "attention_dropout": 0.0, "hidden_dropout": 0.0}
    bert = {"model_type": "bert", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 1024, "vocab_size": 3000, "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1}
    assert not load_model(str(_write_config(tmp_path, "neox", neox))).dropout
    assert load_model(str(_write_config(tmp_path, "bert", bert))).dropout


@pytest.mark.parametrize("field,value", [("cross_entropy", "fusd"), ("attention", "sdpa"), ("norm", "LayerNorm")])
def test_a_model_yaml_with_a_misspelt_choice_is_refused_naming_the_field(tmp_path: Path, field: str,
                                                                         value: str) -> None:
    # a Literal field read as a string it does not list would be costed as whatever the code's else-branch does
    doc = yaml.safe_load((data_dir() / "models" / "gpt2.yaml").read_text())
    doc.update({field: value, "name": "gpt2-typo"})
    path = tmp_path / "gpt2-typo.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match=f"{field} must be one of .*got '{value}'"):
        load_model(str(path))


@pytest.mark.parametrize("model_type, upcast", [
    ("gpt_neo", "scores"), ("gptj", "scores"), ("llama", "softmax"), ("opt", "softmax"), ("gpt2", "none"),
    ("bert", "none")])
def test_hf_config_names_where_eager_attention_leaves_16_bits(model_type: str, upcast: str) -> None:
    # transformers 5: gpt_neo / gptj cast query and key to fp32 before the score matmul; llama's and opt's eager
    # attention run softmax(..., dtype=torch.float32) and cast back; gpt2's and bert's softmax stays in the input's
    # dtype (their modeling files' attention functions)
    from zerotune.predictor.hf_config import model_from_hf_dict
    cfg = {"model_type": model_type, "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
           "vocab_size": 1000, "intermediate_size": 1024, "max_position_embeddings": 512}
    assert model_from_hf_dict(cfg, model_type, "").attention_upcast == upcast


def test_hf_config_of_electra_counts_its_factorized_embedding_and_its_forward_is_torchs_count(tmp_path: Path) -> None:
    """ELECTRA (and ALBERT) factorize the embedding (Lan et al. 2020 sec. 3.1): 128-wide tables and a 128 -> 256
    projection before the blocks (transformers models/electra ElectraModel.embeddings_project). Read at the hidden
    width, electra-small's default config came out 29% over its parameter count; its masked-LM head projects back
    down to 128 before the vocabulary (ElectraGeneratorPredictions), whose GEMM runs 128 wide, not 256."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from zerotune.predictor.flops import micro_batch_flops
    config = transformers.ElectraConfig()  # electra-small's shape: embedding 128, hidden 256, 12 layers
    spec = load_model(str(_write_config(tmp_path, "electra", config.to_dict())))
    assert (spec.embedding_size, spec.hidden_size, spec.head) == (128, 256, "none")
    with torch.device("meta"):
        real = transformers.ElectraModel(config)
    assert spec.num_params == sum(p.numel() for p in real.parameters())
    # the masked-LM generator as a model file would state it: head 'lm' tied, with its transform and bias
    small = transformers.ElectraConfig(vocab_size=4000, num_hidden_layers=2, max_position_embeddings=128)
    mlm = load_model(str(_write_config(tmp_path, "electra-mlm", small.to_dict()))).replace(
        head="lm", head_transform=True, head_bias=True, tied_embeddings=True)
    model = transformers.ElectraForMaskedLM(small)
    assert mlm.num_params == sum(p.numel() for p in model.parameters())
    ids = torch.randint(3, 4000, (2, 64))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    assert micro_batch_flops(mlm, 2, 64, False).forward_flops == pytest.approx(counter.get_total_flops(), rel=1e-3)


def test_hf_config_of_albert_runs_every_layer_and_holds_its_groups_weights(tmp_path: Path) -> None:
    """ALBERT shares its blocks' weights (Lan et al. 2020, sec. 3.1): albert-base-v2's 12 layers run one group's
    weights, so it holds "12M" parameters (their Table 1) where 12 blocks of its own would be 89M. Counted one by
    one until 2026-11-28 (with a warning): parameters, optimizer states and gradient traffic 7.6x too large."""
    config = {"model_type": "albert", "vocab_size": 30000, "embedding_size": 128, "hidden_size": 768,
              "num_hidden_layers": 12, "num_hidden_groups": 1, "num_attention_heads": 12, "intermediate_size": 3072,
              "max_position_embeddings": 512, "type_vocab_size": 2}
    spec = load_model(str(_write_config(tmp_path, "albert", config)))
    assert spec.embedding_size == 128 and spec.head == "pooler"
    assert (spec.num_layers, spec.distinct_layers, spec.held_layers) == (12, 1, 1)
    assert spec.num_params == pytest.approx(12e6, rel=0.03)  # Lan et al. 2020, Table 1: ALBERT base, 12M
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from zerotune.predictor.flops import micro_batch_flops
    with torch.device("meta"):
        assert spec.num_params == sum(p.numel() for p in transformers.AlbertModel(
            transformers.AlbertConfig(**config)).parameters())
    # two groups of two layers each, run over 6 steps: 12 block passes, 4 blocks' weights
    small = transformers.AlbertConfig(vocab_size=2000, embedding_size=64, hidden_size=128, num_attention_heads=4,
                                      intermediate_size=512, num_hidden_layers=6, num_hidden_groups=2,
                                      inner_group_num=2, max_position_embeddings=128,
                                      attn_implementation="eager")  # torch's counter halves the CPU SDPA kernel's
    mlm = load_model(str(_write_config(tmp_path, "albert-small", small.to_dict()))).replace(
        head="lm", head_transform=True, head_bias=True, tied_embeddings=True)
    assert (mlm.num_layers, mlm.distinct_layers) == (12, 4)
    model = transformers.AlbertForMaskedLM(small)
    assert mlm.num_params == sum(p.numel() for p in model.parameters())
    ids = torch.randint(3, 2000, (2, 64))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    assert micro_batch_flops(mlm, 2, 64, False).forward_flops == pytest.approx(counter.get_total_flops(), rel=1e-3)


def test_shared_blocks_cost_every_pass_and_hold_their_weights_once() -> None:
    """ModelSpec.distinct_layers: against the same model with a block of weights per pass, compute and saved
    activations are the same; parameters, optimizer states and ZeRO's gradient traffic are those of the held blocks;
    pipeline stages, which would split the shared blocks, are refused in one line."""
    from zerotune.predictor import DSConfig, Job, estimate
    from zerotune.predictor.dsconfig import ZeroConfig
    from zerotune.predictor.hardware import ClusterSpec
    from zerotune.predictor.memory import estimate_memory
    from zerotune.predictor.zero_mechanics import grad_reduction
    shared = load_model("bert-base").replace(distinct_layers=1)
    own = shared.replace(distinct_layers=0)
    block = own.num_layer_params
    assert own.num_params - shared.num_params == (own.num_layers - 1) * block
    job = lambda m: Job(m, ClusterSpec(load_hardware("a100-80gb"), 1, 8), 512)  # noqa: E731
    for stage in (0, 1, 2, 3):
        cfg = DSConfig(train_micro_batch_size_per_gpu=8, precision="bf16", zero=ZeroConfig(stage=stage))
        a, b = estimate(job(shared), cfg), estimate(job(own), cfg)
        assert a.time.breakdown_s["forward"] == pytest.approx(b.time.breakdown_s["forward"], rel=1e-9)
        assert a.memory.breakdown_bytes["activations"] == pytest.approx(b.memory.breakdown_bytes["activations"],
                                                                        rel=1e-9)
        assert a.time.breakdown_s["optimizer_step"] < b.time.breakdown_s["optimizer_step"]
        assert a.memory.total_bytes < b.memory.total_bytes
        if stage:
            assert grad_reduction(shared, cfg).copy_bytes / grad_reduction(own, cfg).copy_bytes == pytest.approx(
                shared.num_params / own.num_params, rel=1e-6)
    piped = DSConfig(train_micro_batch_size_per_gpu=8, pp_size=2)
    with pytest.raises(ValueError, match="share the weights of 1, which pipeline stages cannot split"):
        estimate_memory(job(shared), piped)


def test_hf_config_of_opt_350m_narrows_its_token_table_and_logits(tmp_path: Path) -> None:
    """facebook/opt-350m (DeepSpeed-Chat's reward model): a 512-wide token table under 1024-wide blocks, project_in and
    project_out between them, post-LN without a final norm. Read as a table at the blocks' width it came out 7.5% over
    OPTForCausalLM's 331,196,416 parameters (transformers 5.24) and its logits GEMM twice as wide; now within 0.5%,
    and a small post-LN OPT's forward FLOPs are torch's FlopCounterMode count."""
    config = {"model_type": "opt", "vocab_size": 50272, "hidden_size": 1024, "num_hidden_layers": 24,
              "num_attention_heads": 16, "ffn_dim": 4096, "word_embed_proj_dim": 512, "do_layer_norm_before": False,
              "max_position_embeddings": 2048}
    spec = load_model(str(_write_config(tmp_path, "opt-350m", config)))
    assert (spec.embedding_size, spec.head_transform, spec.final_norm) == (512, True, False)
    assert spec.num_params == pytest.approx(331_196_416, rel=0.005)
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from zerotune.predictor.flops import micro_batch_flops
    small = transformers.OPTConfig(vocab_size=3000, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                   ffn_dim=1024, word_embed_proj_dim=128, do_layer_norm_before=False,
                                   max_position_embeddings=256, attn_implementation="eager")
    model = transformers.OPTForCausalLM(small)
    ids = torch.randint(3, 3000, (2, 64))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    spec = load_model(str(_write_config(tmp_path, "opt-small", small.to_dict())))
    assert micro_batch_flops(spec, 2, 64, False).forward_flops == pytest.approx(counter.get_total_flops(), rel=1e-3)


def test_hf_config_of_roformer_has_rotary_positions_not_a_learned_table(tmp_path: Path) -> None:
    """RoFormer (Su et al. 2021) rotates q and k by sinusoidal positions; its config says so only through its own key,
    rotary_value. Read as a learned 1536 x hidden position table, a small one came out 7.7% over its parameters and
    was costed the table's add instead of the rotations."""
    config = {"model_type": "roformer", "vocab_size": 5000, "hidden_size": 256, "num_hidden_layers": 3,
              "num_attention_heads": 4, "intermediate_size": 1024, "max_position_embeddings": 1536,
              "rotary_value": False, "type_vocab_size": 2}
    assert load_model(str(_write_config(tmp_path, "roformer", config))).position_embedding == "rotary"
