"""The profiling run reads the user's model (continued from test_profiled.py): Hugging Face families outside the
catalog, heads tied to the embedding, the optimizer the engine steps, vision models, adapters, attention written by
hand, the activation and the bytes a block keeps for backward."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from zerotune.predictor import load_model
from zerotune.validate.profiled import model_yaml, read_profiled
from zerotune.validate.site_env import PROFILING_SITE

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
from zerotune.calibrate.inspect_model import describe  # noqa: E402
from tests.profiled_helpers import (fixture_script, profiling_site_module, saved_bytes_per_block,  # noqa: E402
                                    write_profile)


_HF_FAMILIES = {  # small configs of families outside the catalog, as a Trainer script builds them in code
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
                                                             intermediate_size=1024, rotary_pct=0.5)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
                                                      num_key_value_heads=2, intermediate_size=688, head_dim=64)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=256, n_layer=3, n_head=4)),
    "qwen3_wide_heads": ("Qwen3Config", "Qwen3ForCausalLM", dict(hidden_size=256, num_hidden_layers=3,
                                                                 num_attention_heads=4, num_key_value_heads=2,
                                                                 intermediate_size=688, head_dim=128)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
                                                        num_key_value_heads=2, intermediate_size=688, head_dim=64)),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
                                                intermediate_size=1024)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
                                                ffn_dim=1024, word_embed_proj_dim=256)),
}


@pytest.mark.parametrize("family", sorted(_HF_FAMILIES))
def test_hugging_face_families_outside_the_catalog_are_read_to_their_parameter_count(tmp_path: Path,
                                                                                     family: str) -> None:
    """Rotary (GPT-NeoX, Phi, Qwen3: transformers 5's rope_parameters) and ALiBi (BLOOM) models have no position
    table; Qwen3's SiLU MLP is gated. Read as GPT-2-shaped, GPT-NeoX came out 11% and Qwen3 166% over the module's
    count (a 40960-row position table). Gemma 2's MLP is gated under a GELU (gelu_pytorch_tanh), which its
    config states only by family: from the config alone it came out 15% under (2026-11-25); the block's linears
    show the gate. Qwen3-0.6B's heads are 128 wide against hidden 1024 / 16 heads: q_proj maps 1024 -> 2048; read as
    hidden / heads, a small one came out 15% under."""
    transformers = pytest.importorskip("transformers")
    config_cls, model_cls, kwargs = _HF_FAMILIES[family]
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(vocab_size=5000, **kwargs))
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "input_ids", "shape": [2, 64], "dtype": "int64"}])
    run = read_profiled(prefix, f"hf-{family}", 2)
    assert run.model.num_params == pytest.approx(sum(p.numel() for p in model.parameters()), rel=0.01)


def test_the_bytes_a_block_keeps_for_backward_scale_the_activation_formula(tmp_path: Path) -> None:
    """The profiling hook counts what autograd saves in the first block (saved-tensor hooks); the model's
    activation_scale then makes the formula give exactly that for the script's own code."""
    from zerotune.predictor.activations import layer_activation_bytes
    spec = importlib.util.spec_from_file_location("zt_site_test", PROFILING_SITE / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(site)  # type: ignore[union-attr]
    module = fixture_script("encoder_mlm")
    model = module.MaskedLM()
    state = {"block_saved_bytes": 0, "block_saved_calls": 0}
    site._counts().count_saved(model, model.encoder.layers[0], state, "block")
    ids = torch.randint(5, module.VOCAB, (2, module.SEQ))
    model({"input_ids": ids, "labels": ids}).backward()
    saved = state["block_saved_bytes"]
    model({"input_ids": ids, "labels": ids})
    assert state["block_saved_bytes"] == saved  # only the first forward is counted
    # at least the formula's tensors (Korthikanti et al. 2022 eq. 2 in fp32): PyTorch's eager attention keeps more
    assert saved > layer_activation_bytes(load_model("bert-base").replace(
        hidden_size=384, num_heads=6, num_kv_heads=6, ffn_hidden_size=1536), 2, module.SEQ, 4)
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "input_ids", "shape": [2, module.SEQ], "dtype": "int64"}],
                   block_saved_bytes=saved)
    run = read_profiled(prefix, "enc", 2)
    assert run.model.activation_scale > 1.0
    assert layer_activation_bytes(run.model, 2, module.SEQ, 4) == pytest.approx(saved, rel=1e-3)
    assert any("kept" in line and "for backward" in line for line in run.read)


def test_a_head_tied_through_f_linear_on_the_embedding_is_read(tmp_path: Path) -> None:
    """The built-in workload projects with `F.linear(x, tokens.weight)`: no Linear module to read, so the profiling
    hook watches F.linear in the first forward. Without it the logits GEMM (2 x 384 x 50257 FLOPs per token, more
    than the six blocks' 6 x 24 x 384^2) was left out and the builtin job's mbs-8 prediction ran 1.6x optimistic."""
    from zerotune.calibrate.workload import build_model
    spec = importlib.util.spec_from_file_location("zt_profiling_site", PROFILING_SITE / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(site)  # type: ignore[union-attr]
    model = build_model(load_model("zt-gpt-small"))
    linear = torch.nn.functional.linear
    state: dict = {}
    site._watch_embedding_projection(model, state)
    model(torch.randint(0, 50257, (1, 17)))
    assert state["embedding_projections"] == 1 and torch.nn.functional.linear is linear  # one projection, unwrapped
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "", "shape": [1, 17], "dtype": "int64"}], embedding_projections=1)
    run = read_profiled(prefix, "builtin", 2)
    assert (run.model.head, run.model.tied_embeddings) == ("lm", True)
    assert run.model.num_params == sum(p.numel() for p in model.parameters())  # tied: no parameter added
    write_profile(prefix, model, [{"name": "", "shape": [1, 17], "dtype": "int64"}], embedding_projections=0)
    assert read_profiled(prefix, "builtin", 2).model.head == "none"  # nothing seen, nothing invented


@pytest.mark.parametrize("form", ["x @ table.T", "torch.matmul", "torch.einsum"])
def test_a_head_tied_through_a_matmul_on_the_embedding_is_read(form: str) -> None:
    """Scripts also write the tied head as `x @ wte.weight.T` or with matmul / einsum: the profiling hook's torch
    function mode sees each, once per forward, and leaves no mode behind (later steps run unwatched)."""
    spec = importlib.util.spec_from_file_location("zt_profiling_site", PROFILING_SITE / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(site)  # type: ignore[union-attr]
    project = {"x @ table.T": lambda x, w: x @ w.T, "torch.matmul": lambda x, w: torch.matmul(x, w.t()),
               "torch.einsum": lambda x, w: torch.einsum("bsh,vh->bsv", x, w)}[form]

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.mix = torch.nn.Embedding(97, 16), torch.nn.Linear(16, 16)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return project(self.mix(self.wte(ids)), self.wte.weight)

    model, state = Tied(), {}
    site._watch_embedding_projection(model, state)
    model(torch.randint(0, 97, (2, 5))).sum().backward()
    model(torch.randint(0, 97, (2, 5)))
    assert state["embedding_projections"] == 1 and not torch._C._is_torch_function_mode_enabled()


@pytest.mark.parametrize("optimizer, impl", [
    ({"class": "torch.optim.adamw.AdamW", "fused": None, "foreach": None}, "torch"),  # AdamW(model.parameters())
    ({"class": "torch.optim.adamw.AdamW", "fused": True, "foreach": None}, "fused"),  # Trainer's adamw_torch_fused
    ({"class": "deepspeed.ops.adam.fused_adam.FusedAdam", "fused": None, "foreach": None}, "fused"),
    ({"class": "bitsandbytes.optim.adamw.AdamW8bit", "fused": None, "foreach": None}, None),
], ids=["torch-adamw", "torch-adamw-fused", "deepspeed-fused-adam", "other"])
def test_the_optimizer_the_engine_steps_is_read(tmp_path: Path, optimizer: dict, impl: str | None) -> None:
    model = fixture_script("encoder_mlm").MaskedLM()
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "input_ids", "shape": [2, 128], "dtype": "int64"}], optimizer=optimizer)
    run = read_profiled(prefix, "encoder", 2)
    assert run.optimizer_impl == impl
    assert any(line.startswith("optimizer ") for line in (run.read if impl else run.assumed))


def test_a_vision_transformer_without_a_token_embedding_is_read_from_its_blocks(tmp_path: Path) -> None:
    # The fixture's constants: patches into width 256, 6 blocks of 8 heads and MLP 1024, 65 positions (64 patches
    # and the class token). No nn.Embedding: vocabulary 0, no vocabulary head; the sequence comes from the first
    # block's input (batch first here), the micro-batch from the images' first dimension.
    model = fixture_script("vit_classifier").ViT()
    s = describe(model)["structure"]
    assert (s["num_layers"], s["hidden_size"], s["num_heads"], s["ffn_hidden_size"]) == (6, 256, 8, 1024)
    assert (s["vocab_size"], s["head"]) == (0, "none")
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "", "shape": [4, 3, 64, 64], "dtype": "float32"}],
                   block_input=[{"name": "", "shape": [4, 65, 256], "dtype": "float32"}])
    run = read_profiled(prefix, "vit", 2)
    assert (run.micro_batch, run.seq_len) == (4, 65) and run.matmul is None  # no speed check recorded
    path = tmp_path / "model_profiled.yaml"
    path.write_text(model_yaml(run, "test"))
    spec = load_model(str(path))
    # what is left out: the patch projection (3 x 8 x 8 x 256 + 256), the class token and positions (66 x 256)
    # and the classifier (256 x 100 + 100): 92,516 of 4,831,076 parameters
    left_out = 3 * 8 * 8 * 256 + 256 + 66 * 256 + 256 * 100 + 100
    assert spec.num_params + left_out == sum(p.numel() for p in model.parameters())


def test_a_sequence_first_block_input_gives_batch_and_sequence_the_right_way_round(tmp_path: Path) -> None:
    model = fixture_script("vit_classifier").ViT()
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "", "shape": [4, 3, 64, 64], "dtype": "float32"}],
                   block_input=[{"name": "", "shape": [65, 4, 256], "dtype": "float32"}])
    run = read_profiled(prefix, "vit", 2)
    assert (run.micro_batch, run.seq_len) == (4, 65)


def test_a_hugging_face_vision_model_is_read_from_its_modules(tmp_path: Path) -> None:
    # ViTConfig has no vocab_size: the modules say what the model is (4 blocks of width 192, 3 heads, MLP 768)
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
                                    intermediate_size=768, image_size=64, patch_size=8, num_labels=10)
    model = transformers.ViTForImageClassification(config)
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "pixel_values", "shape": [2, 3, 64, 64], "dtype": "float32"}],
                   block_input=[{"name": "", "shape": [2, 65, 192], "dtype": "float32"}])
    run = read_profiled(prefix, "vit", 2)
    spec = run.model
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.ffn_hidden_size, spec.vocab_size) == \
        (4, 192, 3, 768, 0)
    assert (run.micro_batch, run.seq_len) == (2, 65) and "without a vocabulary" in run.read[0]
    # left out: the patch projection (3 x 8 x 8 x 192 + 192), the class token and positions (66 x 192), the
    # classifier (192 x 10 + 10)
    left_out = 3 * 8 * 8 * 192 + 192 + 66 * 192 + 192 * 10 + 10
    assert spec.num_params + left_out == sum(p.numel() for p in model.parameters())


def test_a_language_model_fed_embeddings_takes_its_sequence_from_the_first_block(tmp_path: Path) -> None:
    # the script computes the embeddings itself and calls the model with a float tensor: no token ids to read
    prefix = tmp_path / "profiled"
    hidden = [{"name": "", "shape": [3, 40, 256], "dtype": "float32"}]
    write_profile(prefix, fixture_script("decoder_lm").Decoder(), hidden, block_input=hidden)
    run = read_profiled(prefix, "d", 2)
    assert (run.micro_batch, run.seq_len) == (3, 40)


class _TimmAttention(torch.nn.Module):  # timm's layout: one fused qkv Linear, num_heads as an attribute
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)


class _TimmBlock(torch.nn.Module):
    def __init__(self, dim: int, num_heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.attn = _TimmAttention(dim, num_heads)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, dim))


def test_blocks_in_an_nn_sequential_are_read_as_timms_vision_transformer_keeps_them() -> None:
    # timm's VisionTransformer: patch_embed (a Conv2d), cls_token and pos_embed parameters, then
    # self.blocks = nn.Sequential(*[Block(...)]) - not a ModuleList; the MLP's own nn.Sequential (three
    # modules of different classes) is not taken for the blocks
    model = torch.nn.Module()
    model.patch_embed = torch.nn.Conv2d(3, 192, 16, 16)
    model.blocks = torch.nn.Sequential(*[_TimmBlock(192, 3, 768) for _ in range(5)])
    model.norm, model.head = torch.nn.LayerNorm(192), torch.nn.Linear(192, 10)
    s = describe(model)["structure"]
    assert (s["num_layers"], s["hidden_size"], s["num_heads"], s["ffn_hidden_size"], s["vocab_size"]) == \
        (5, 192, 3, 768, 0)


def _peft_style_lora(model: torch.nn.Module, targets: tuple[str, ...], rank: int) -> torch.nn.Module:
    """Adapters as peft lays them out (tuners/lora/layer.py): the frozen nn.Linear becomes `base_layer` beside
    `lora_A` / `lora_B` ModuleDicts of nn.Linear (in -> r, r -> out); everything else frozen."""
    class Wrapped(torch.nn.Module):
        def __init__(self, base: torch.nn.Linear) -> None:
            super().__init__()
            self.base_layer = base
            self.lora_A = torch.nn.ModuleDict({"default": torch.nn.Linear(base.in_features, rank, bias=False)})
            self.lora_B = torch.nn.ModuleDict({"default": torch.nn.Linear(rank, base.out_features, bias=False)})

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x))

    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and child_name in targets:
                setattr(module, child_name, Wrapped(child))
    return model


def test_frozen_weights_and_peft_style_adapters_are_read(tmp_path: Path) -> None:
    """A LoRA fine-tune's model: the block's shapes come from the frozen base layers, not the adapters' in -> r maps
    (which would read as a narrow K/V projection), and the model YAML counts what trains."""
    model = _peft_style_lora(fixture_script("decoder_lm").Decoder(), ("q_proj", "v_proj"), rank=8)
    doc = describe(model)
    s = doc["structure"]
    # the fixture's constants as in test_decoder_grouped_kv_and_gated_mlp_are_read_from_linear_shapes
    assert (s["num_layers"], s["hidden_size"], s["num_kv_heads"], s["ffn_hidden_size"]) == (6, 256, 2, 704)
    # per block: q 8 x (256 + 256), v 8 x (256 + 64); everything else frozen
    assert doc["training"]["adapter_params"] == 6 * 8 * (256 + 256 + 256 + 64)
    assert doc["training"]["adapter_tensors"] == 6 * 4 and doc["training"]["trainable_params"] == 6 * 8 * 832
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "ids", "shape": [2, 97], "dtype": "int64"}])
    spec = read_profiled(prefix, "lora", 2).model
    assert spec.frozen_layer_params == spec.num_layer_params and spec.frozen_outer_params == spec.num_outer_params
    assert spec.num_trainable_params == 6 * 8 * 832 and spec.num_trainable_tensors == 24


def test_hugging_face_model_wrapped_by_peft_is_read() -> None:
    """peft's get_peft_model around a Hugging Face Llama: the config is the base model's, the adapters are counted."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(config),
                                peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    doc = describe(model)
    assert doc["hf_config"]["hidden_size"] == 128 and doc["structure"]["ffn_hidden_size"] == 352
    # q: 4 x (128 + 128), v: 4 x (128 + 64) a layer
    assert doc["training"]["adapter_params"] == 3 * 4 * (256 + 192) == doc["training"]["trainable_params"]


def test_an_encoder_decoder_runs_its_one_stack_at_the_layer_weighted_mean_of_its_two_sequences(tmp_path: Path) -> None:
    """T5 (Hugging Face's seq2seq examples under DeepSpeed): the hooked block is the decoder's (the larger, with
    cross-attention) and sees the target length; the input ids carry the source length. The catalog describes both
    stacks as one (8 layers here), so the stack runs at (4 x 64 + 4 x 16) / 8 = 40 positions: its layers x
    positions are the model's 4 x 64 + 4 x 16."""
    pytest.importorskip("transformers")
    from transformers import T5Config, T5ForConditionalGeneration
    model = T5ForConditionalGeneration(T5Config(vocab_size=1000, d_model=128, d_kv=32, d_ff=512, num_layers=4,
                                                num_decoder_layers=4, num_heads=4))
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "input_ids", "shape": [2, 64], "dtype": "int64"},
                                   {"name": "labels", "shape": [2, 16], "dtype": "int64"}],
                   block_input=[{"name": "", "shape": [2, 16, 128], "dtype": "float32"}])
    run = read_profiled(prefix, "t5", 2)
    assert run.model.num_layers == 8 and (run.micro_batch, run.seq_len) == (2, 40)
    assert any(r.startswith("encoder-decoder: 4 encoder layers over 64 positions") for r in run.read)
    # the encoder's square projections are a stack of blocks, not an LM-head transform; its embed_tokens is the
    # shared token table again, not a position table
    assert not run.model.head_transform and not any("learned positions" in r for r in run.read)


class _Classifier(torch.nn.Module):
    """Token embedding, a mixer and a 5-way classifier head: no projection onto the embedding's table."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.mix, self.head = torch.nn.Embedding(300, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mix(self.tok(ids)).mean(dim=1))


def _flatten_like_zero(model: torch.nn.Module) -> None:
    """What ZeRO-1 and -2 do to the parameters (stage_1_and_2.py: the bit16 groups flattened): every parameter a
    view into one buffer."""
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    offset = 0
    for p in params:
        p.data = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()


def test_a_classifier_in_zeros_flat_buffer_has_no_head_tied_to_its_embedding() -> None:
    """Under ZeRO-1/2 every weight shares the embedding's storage: a tool run on a 5-class classifier read a tied LM
    head from that (7 'projections') and costed a vocabulary-wide logits GEMM the script never runs. Only an
    argument inside the table's own bytes is a projection onto it; a real tied head in the same buffer still is."""
    site = profiling_site_module()
    model, state = _Classifier(), {}
    _flatten_like_zero(model)
    site._watch_embedding_projection(model, state)
    model(torch.randint(0, 300, (2, 7)))
    assert state["embedding_projections"] == 0

    class Tied(_Classifier):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(self.mix(self.tok(ids)), self.tok.weight)

    tied, state = Tied(), {}
    _flatten_like_zero(tied)
    site._watch_embedding_projection(tied, state)
    tied(torch.randint(0, 300, (2, 7)))
    assert state["embedding_projections"] == 1


class _HandAttention(torch.nn.Module):
    """Grouped-query attention as users write it, heads kept under names no reader knows (nh, nkv, hd)."""

    def __init__(self, d: int = 256, nh: int = 8, nkv: int = 2, sdpa: bool = True) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd, self.sdpa = nh, nkv, d // nh, sdpa
        self.q, self.k = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, nkv * self.hd, bias=False)
        self.v, self.o = torch.nn.Linear(d, nkv * self.hd, bias=False), torch.nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.nh, self.hd).transpose(1, 2)
        k = self.k(x).view(b, s, self.nkv, self.hd).transpose(1, 2).repeat_interleave(self.nh // self.nkv, 1)
        v = self.v(x).view(b, s, self.nkv, self.hd).transpose(1, 2).repeat_interleave(self.nh // self.nkv, 1)
        if self.sdpa:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = torch.softmax(q @ k.transpose(-2, -1) / self.hd ** 0.5, dim=-1) @ v
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class _HandDecoder(torch.nn.Module):
    def __init__(self, sdpa: bool = True) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(600, 256)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict({"norm": torch.nn.LayerNorm(256), "attn": _HandAttention(sdpa=sdpa),
                                 "norm2": torch.nn.LayerNorm(256),
                                 "up": torch.nn.Linear(256, 512), "down": torch.nn.Linear(512, 256)})
            for _ in range(2))
        self.out = torch.nn.Linear(256, 600, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for blk in self.blocks:
            x = x + blk["attn"](blk["norm"](x))
            x = x + blk["down"](torch.relu(blk["up"](blk["norm2"](x))))
        return self.out(x)


@pytest.mark.parametrize("sdpa", [True, False])
def test_heads_no_module_names_are_read_from_the_first_forwards_attention(tmp_path: Path, sdpa: bool) -> None:
    """A hand-written grouped-query attention (8 heads of 32 sharing 2 K/V heads, attributes nh / nkv / hd) was
    read as 4 heads of 64 and 1 K/V head. The head width the first forward's attention ran (the query of
    scaled_dot_product_attention, or q @ k^T) gives the heads; the K/V projections' width gives their heads."""
    site = profiling_site_module()
    model, state = _HandDecoder(sdpa), {"sdpa_calls": 0, "sdpa_dropout_p": 0.0}
    doc = describe(model)
    assert doc["structure"]["num_heads"] == 4 and doc["assumed_fields"] == ["num_heads"]  # the guess, flagged
    if sdpa:
        shapes = []
        real = torch.nn.functional.scaled_dot_product_attention
        torch.nn.functional.scaled_dot_product_attention = lambda q, k, *a, **kw: (shapes.append(
            [list(q.shape), list(k.shape)]), real(q, k, *a, **kw))[1]
        try:
            model(torch.randint(0, 600, (2, 40)))
        finally:
            torch.nn.functional.scaled_dot_product_attention = real
        rank0 = {"sdpa_shapes": shapes[0], "sdpa_calls": 2}
    else:
        site._watch_embedding_projection(model, state)
        model(torch.randint(0, 600, (2, 40)))
        assert state["attention_matmul"] == [2, 8, 40, 32]
        rank0 = {"attention_matmul": state["attention_matmul"]}
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "", "shape": [2, 40], "dtype": "int64"}], **rank0)
    run = read_profiled(prefix, "hand", 2)
    assert (run.model.num_heads, run.model.num_kv_heads) == (8, 2)
    assert not any(a.startswith("heads of ") for a in run.assumed)
    assert run.model.num_params == sum(p.numel() for p in model.parameters())


def test_heads_a_module_states_are_not_replaced_by_the_forwards() -> None:
    """Where a module names its heads (nn.MultiheadAttention, num_heads attributes) nothing is flagged as assumed."""
    assert describe(fixture_script("encoder_mlm").MaskedLM())["assumed_fields"] == []


class _TorchEncoder(torch.nn.Module):
    """nn.TransformerEncoder as DeepSpeedExamples-style classifiers use it (ReLU by default)."""

    def __init__(self, activation: str) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(500, 64)
        layer = torch.nn.TransformerEncoderLayer(64, 4, 256, batch_first=True, activation=activation)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(64, 3)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_the_activation_is_read_from_the_block(activation: str) -> None:
    """An nn.TransformerEncoder classifier's MLP runs ReLU (its activation_relu_or_gelu flag; the function is no
    module); model_profiled.yaml said gelu (2026-11-26). A Hugging Face config names it (hidden_act)."""
    s = describe(_TorchEncoder(activation))["structure"]
    assert (s["num_layers"], s["hidden_size"], s["ffn_hidden_size"], s["activation"]) == (2, 64, 256, activation)
    transformers = pytest.importorskip("transformers")
    from zerotune.predictor.hf_config import model_from_hf_dict
    qwen = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=1, vocab_size=500)
    assert model_from_hf_dict(qwen.to_dict(), "qwen", "test").activation == "silu"
    t5 = transformers.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=500)
    assert model_from_hf_dict(t5.to_dict(), "t5", "test").activation == "relu"


def test_a_decoder_blocks_cross_attention_keeps_the_sources_positions() -> None:
    """The hooked block of a T5 is a decoder block; its cross-attention keeps keys, values, their input (the
    encoder's output) and scores over the source's positions. Costed at the target's length, a T5 at source 128 /
    target 32 read 3.4x its formula in the decoder block against 1.65x in an encoder block, a scale then applied
    to every block; with the source's positions the two agree within 30% (transformers 5.24, eager attention)."""
    transformers = pytest.importorskip("transformers")
    from zerotune.predictor.activations import layer_activation_bytes
    from zerotune.predictor.hf_config import model_from_hf_dict
    config = transformers.T5Config(vocab_size=1000, d_model=128, d_kv=32, d_ff=512, num_layers=4, num_decoder_layers=4,
                                   num_heads=4, decoder_start_token_id=0, pad_token_id=0, attn_implementation="eager")
    model = transformers.T5ForConditionalGeneration(config)
    spec = model_from_hf_dict(config.to_dict(), "t5", "test")
    for b, source, target in ((2, 128, 32), (4, 32, 32)):
        dec, enc = saved_bytes_per_block(model, [model.decoder.block[1], model.encoder.block[1]],
                                input_ids=torch.randint(3, 1000, (b, source)),
                                decoder_input_ids=torch.randint(3, 1000, (b, target)))
        dec_scale = dec / layer_activation_bytes(spec, b, target, 4, cross_share=1.0, cross_seq_len=source)
        enc_scale = enc / layer_activation_bytes(spec, b, source, 4, cross_share=0.0)
        assert dec_scale == pytest.approx(enc_scale, rel=0.3), (source, target)
