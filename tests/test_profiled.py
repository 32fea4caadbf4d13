"""The profiling run reads the user's model: zerotune.calibrate.inspect_model on the fixture scripts' modules, the files the
profiling hook writes turned into model_profiled.yaml and a measurement (zerotune.validate.profiled), and the one-line
error for a model whose structure cannot be read. Encoders, decoders, Hugging Face configs and the stand-in for models
without transformer blocks, positions held as bare parameters; test_profiled_shapes.py and test_profiled_host.py
hold the rest."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from zerotune.predictor import load_model
from zerotune.validate.profiled import model_yaml, read_profiled
from zerotune.validate.site_env import PROFILING_SITE, peak_env, profiling_env, read_peak_bytes

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
from zerotune.calibrate.inspect_model import describe  # noqa: E402
from tests.profiled_helpers import fixture_script, profiled_yaml, write_profile  # noqa: E402


def test_encoder_structure_is_read_from_nn_multihead_attention() -> None:
    doc = describe(fixture_script("encoder_mlm").MaskedLM())
    s = doc["structure"]
    # the fixture's constants: 4 layers, width 384, 6 heads, MLP 1536, vocabulary 8192, 512 positions, 2 token types
    assert (s["num_layers"], s["hidden_size"], s["num_heads"], s["num_kv_heads"]) == (4, 384, 6, 6)
    assert (s["ffn_hidden_size"], s["vocab_size"], s["max_position_embeddings"], s["type_vocab_size"]) == \
        (1536, 8192, 512, 2)
    assert s["tied_embeddings"] and s["embedding_norm"] and not s["gated_mlp"] and s["norm"] == "layernorm"
    assert doc["num_params"] == sum(p.numel() for p in fixture_script("encoder_mlm").MaskedLM().parameters())
    # nn.TransformerEncoderLayer's attention is nn.MultiheadAttention, whose layout copies are costed
    # (predictor/ops.py MHA_RW_ELEMS, the fixture's layers are batch-first); a block of plain linears is not flagged
    assert s["torch_multihead_attention"] == "batch_first"
    assert "torch_multihead_attention" not in describe(fixture_script("decoder_lm").Decoder())["structure"]
    default = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(128, 4), 3)  # (sequence, batch, width)
    assert describe(default)["structure"]["torch_multihead_attention"] == "sequence_first"


class _TorchDecoderGPT(torch.nn.Module):
    """A decoder-only model built of nn.TransformerDecoderLayer, attending over its own input as the memory."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(5000, 320), torch.nn.Embedding(256, 320)
        self.blocks = torch.nn.ModuleList([torch.nn.TransformerDecoderLayer(320, 5, 1280, batch_first=True)
                                           for _ in range(3)])
        self.ln, self.head = torch.nn.LayerNorm(320), torch.nn.Linear(320, 5000, bias=False)


class _TorchSeq2Seq(torch.nn.Module):
    """nn.Transformer between a shared token embedding and a vocabulary projection (PyTorch's translation tutorial)."""

    def __init__(self, encoder_layers: int, decoder_layers: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(3000, 256)
        self.t = torch.nn.Transformer(256, 4, encoder_layers, decoder_layers, 1024, batch_first=True)
        self.out = torch.nn.Linear(256, 3000)


@pytest.mark.parametrize("model, layers, cross, hidden", [
    (_TorchDecoderGPT(), 3, 3, 320),        # every block a self- and a cross-attention
    (_TorchSeq2Seq(3, 2), 5, 2, 256),       # find_blocks picks the encoder stack (more parameters): the decoder's
    (_TorchSeq2Seq(2, 3), 5, 3, 256),       # found beside it, and the other way round
])
def test_torch_decoder_layers_are_read_with_their_cross_attention(tmp_path: Path, model: torch.nn.Module, layers: int,
                                                                   cross: int, hidden: int) -> None:
    s = describe(model)["structure"]
    assert (s["num_layers"], s["cross_attention_layers"], s["hidden_size"]) == (layers, cross, hidden)
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "", "shape": [2, 64], "dtype": "int64"}])
    path = tmp_path / "model_profiled.yaml"
    path.write_text(model_yaml(read_profiled(prefix, "profiled-torch", 2), "test"))
    # the description holds the module's parameters but for nn.Transformer's second final norm (2 x 256)
    assert load_model(str(path)).num_params == pytest.approx(sum(p.numel() for p in model.parameters()), abs=512)


def test_torch_seq2seq_runs_at_the_layer_weighted_mean_of_its_two_lengths(tmp_path: Path) -> None:
    # nn.Transformer with 2 encoder and 3 decoder layers: the hook sees the first decoder block's input (64 target
    # positions), the source ids are 96 long: one stack of 5 at (2 x 96 + 3 x 64) / 5 = 76.8 -> 77 positions
    model, prefix = _TorchSeq2Seq(2, 3), tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "", "shape": [2, 96], "dtype": "int64"}],
                   block_input=[{"name": "", "shape": [2, 64, 256], "dtype": "float32"}])
    run = read_profiled(prefix, "profiled-seq2seq", 2)
    assert (run.micro_batch, run.seq_len) == (2, 77)
    assert any("encoder-decoder: 2 encoder layers over 96" in line for line in run.read)


def test_decoder_grouped_kv_and_gated_mlp_are_read_from_linear_shapes() -> None:
    doc = describe(fixture_script("decoder_lm").Decoder())
    s = doc["structure"]
    # 6 blocks of width 256, 8 heads sharing 2 K/V heads (k_proj 256 -> 64), SwiGLU 704, untied head, no biases
    assert (s["num_layers"], s["hidden_size"], s["num_heads"], s["num_kv_heads"]) == (6, 256, 8, 2)
    assert (s["ffn_hidden_size"], s["gated_mlp"], s["vocab_size"], s["tied_embeddings"]) == (704, True, 6000, False)
    assert s["norm"] == "rmsnorm" and s["position_embedding"] == "rotary" and not s["qkv_bias"]


@pytest.mark.parametrize("script, cls, counted_rel", [
    ("decoder_lm", "Decoder", 0.0),        # every tensor is one ModelSpec.tensors() lists
    ("encoder_mlm", "MaskedLM", 0.0),      # the MLM head: transform (h x h + norm) and the vocabulary bias counted
])
def test_profiled_yaml_loads_and_counts_the_parameters(tmp_path: Path, script: str, cls: str, counted_rel: float) -> None:
    model = getattr(fixture_script(script), cls)()
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "", "shape": [4, 97], "dtype": "int64"}])
    run = read_profiled(prefix, f"profiled-{script}", 2)
    assert (run.micro_batch, run.seq_len, run.peak_memory_bytes) == (4, 97, 1.5e9)  # the largest rank's peak
    path = tmp_path / "model_profiled.yaml"
    path.write_text(model_yaml(run, "test"))
    spec = load_model(str(path))
    counted = sum(p.numel() for p in model.parameters())
    assert spec.num_params == pytest.approx(counted, rel=counted_rel, abs=0)
    assert "# read: " in path.read_text() and spec.max_position_embeddings >= 97


def test_inputs_padded_per_batch_are_costed_at_the_longest_and_measured_at_the_longest_of_the_ranks(
        tmp_path: Path) -> None:
    """A collator that pads each batch to its longest sample (the Hugging Face Trainer's default with a tokenizer):
    the first forward's length was one random sample's (a RoBERTa script read 162 and, with another seed, 72, where
    its batches of 8 padded to about 229). Memory is costed at the longest length any rank saw; the profiling run's
    own steps went at the pace of the longer of its two ranks' batches, the expected longest of two draws from the
    lengths it saw, and every length is kept for tune to time each micro-batch at its own expected longest."""
    prefix = tmp_path / "profiled"
    inputs = [{"name": "input_ids", "shape": [1, 72], "dtype": "int64"}]
    write_profile(prefix, fixture_script("encoder_mlm").MaskedLM(), inputs, input_lengths=[72, 200, 131])
    rank1 = json.loads(Path(f"{prefix}.rank1.json").read_text())
    Path(f"{prefix}.rank1.json").write_text(json.dumps({**rank1, "input_lengths": [240, 18, 150]}))
    run = read_profiled(prefix, "enc", 2)
    seen = [72, 200, 131, 240, 18, 150]
    longer_of_two = sum(max(a, b) for a in seen for b in seen) / len(seen) ** 2
    assert (run.seq_len, run.measured_seq_len) == (240, round(longer_of_two))
    assert sorted(run.input_lengths) == sorted(seen)
    assert any("pads each batch to its longest" in line for line in run.read)
    same = [{"name": "input_ids", "shape": [1, 128], "dtype": "int64"}]
    write_profile(prefix, fixture_script("encoder_mlm").MaskedLM(), same, input_lengths=[128, 128, 128])
    assert (read_profiled(prefix, "enc", 2).seq_len, read_profiled(prefix, "enc", 2).measured_seq_len) == (128, None)
    assert read_profiled(prefix, "enc", 2).input_lengths == ()


def test_deepspeed_moe_experts_are_one_mlp_not_a_gated_one_and_refuse_zero3(tmp_path: Path) -> None:
    """A DeepSpeedExamples-style decoder whose MLPs are deepspeed.moe.layer.MoE (4 experts, 2 local per rank, top-1):
    the two local experts' h -> f maps were read as a gated MLP's gate and up projections. One expert is what a
    token runs; the layers are recorded, and tune leaves out ZeRO-3, which DeepSpeed's engine refuses for them."""
    from deepspeed.moe.layer import MoE

    from zerotune.predictor.space import space_from_ds_config
    from zerotune.validate.profiling_run import moe_space

    class Expert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(64), torch.nn.LayerNorm(64)
            self.qkv, self.proj = torch.nn.Linear(64, 192), torch.nn.Linear(64, 64)
            self.moe = MoE(hidden_size=64, expert=Expert(), num_experts=4, ep_size=2, k=1)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = torch.nn.Embedding(500, 64), torch.nn.Embedding(128, 64)
            self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
            self.ln_f = torch.nn.LayerNorm(64)

    doc = describe(Model())
    assert (doc["structure"]["ffn_hidden_size"], doc["structure"]["gated_mlp"]) == (256, False)
    assert doc["moe"] == {"layers": 3, "num_experts": 4, "ep_size": 2, "local_experts": 2, "top_k": 1}
    assert any("all-to-alls" in line for line in doc["assumed"])  # the rank's 2 experts are held, 1 runs
    prefix = tmp_path / "profiled"
    Path(f"{prefix}.model.json").write_text(json.dumps(doc, default=str))
    state = {"rank": 0, "inputs": [{"name": "", "shape": [1, 96], "dtype": "int64"}], "forward_calls": 3,
             "block_calls": 3, "step_s": [2.0, 1.0, 1.2]}
    Path(f"{prefix}.rank0.json").write_text(json.dumps(state))
    run = read_profiled(prefix, "moe", 1)
    assert run.native_moe and (run.model.num_experts, run.model.experts_per_token, run.model.mlp_width) == (2, 1, 256)
    said: list[str] = []
    space = space_from_ds_config({"zero_optimization": {"stage": [0, 1, 2, 3]}}, world_size=2)
    kept = moe_space(SimpleNamespace(script_moe=True), space, said.append)  # type: ignore[arg-type]
    assert {v.zero.stage for v in kept.variants} == {0, 1, 2} and "stage 3 left out" in said[0]
    assert moe_space(SimpleNamespace(script_moe=False), space, said.append) is space  # type: ignore[arg-type]
    only3 = space_from_ds_config({"zero_optimization": {"stage": 3}}, world_size=2)
    with pytest.raises(ValueError, match="zero_optimization.stage: .* MoE .* list stage 0, 1 or 2"):
        moe_space(SimpleNamespace(script_moe=True), only3, said.append)  # type: ignore[arg-type]


def test_a_cpu_peak_set_by_rank_0s_speed_checks_is_not_the_trainings(tmp_path: Path) -> None:
    """getrusage's peak cannot be reset: where rank 0's steps never went above what its matmul and copy checks
    reached, its peak is the checks', and the other rank's is the training's."""
    prefix = tmp_path / "profiled"
    inputs = [{"name": "input_ids", "shape": [1, 128], "dtype": "int64"}]
    write_profile(prefix, fixture_script("encoder_mlm").MaskedLM(), inputs, peak_memory_bytes=8.26e8,
                   checks_peak_memory_bytes=8.26e8)
    rank1 = json.loads(Path(f"{prefix}.rank1.json").read_text())
    Path(f"{prefix}.rank1.json").write_text(json.dumps({**rank1, "peak_memory_bytes": 7.77e8,
                                                         "checks_peak_memory_bytes": None}))
    assert read_profiled(prefix, "enc", 2).peak_memory_bytes == 7.77e8
    write_profile(prefix, fixture_script("encoder_mlm").MaskedLM(), inputs, peak_memory_bytes=9.5e8,
                   checks_peak_memory_bytes=8.26e8)  # rank 0's steps went above: the larger rank's, as before
    assert read_profiled(prefix, "enc", 2).peak_memory_bytes == 1.5e9


def test_checkpointing_and_fused_attention_are_read_from_the_first_step(tmp_path: Path) -> None:
    prefix = tmp_path / "profiled"
    inputs = [{"name": "input_ids", "shape": [2, 64], "dtype": "int64"}]
    matmul = {"m": 2048, "n": 2048, "k": 2048, "dtype": "fp32", "flops_per_s": 1.5e11}
    write_profile(prefix, fixture_script("decoder_lm").Decoder(), inputs, block_calls=6, sdpa_calls=36, matmul=matmul)
    run = read_profiled(prefix, "d", 2)
    assert run.activation_checkpointing and run.model.attention == "flash" and run.seq_len == 64
    assert run.matmul == ("fp32", 2048, 1.5e11)


def test_checkpointing_inside_the_block_is_read_from_its_first_modules_calls(tmp_path: Path) -> None:
    """torch.utils.checkpoint(self._forward, x) inside a block: the block is called once a micro-step, its modules
    twice (forward, and again in backward). The bytes it kept are its input alone, so they scale nothing."""
    prefix = tmp_path / "profiled"
    inputs = [{"name": "input_ids", "shape": [2, 64], "dtype": "int64"}]
    write_profile(prefix, fixture_script("decoder_lm").Decoder(), inputs, block_calls=3, inner_calls=6,
                   block_saved_bytes=2 * 64 * 256 * 4)
    run = read_profiled(prefix, "d", 2)
    assert run.activation_checkpointing and run.model.activation_scale == 1.0
    write_profile(prefix, fixture_script("decoder_lm").Decoder(), inputs, block_calls=3, inner_calls=3)
    assert not read_profiled(prefix, "d", 2).activation_checkpointing


def test_hugging_face_config_is_used_directly(tmp_path: Path) -> None:
    model = fixture_script("decoder_lm").Decoder()
    hf = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
          "num_hidden_layers": 6, "intermediate_size": 704, "vocab_size": 6000, "max_position_embeddings": 1024}
    model.config = SimpleNamespace(to_dict=lambda: dict(hf))
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "input_ids", "shape": [2, 64], "dtype": "int64"}])
    run = read_profiled(prefix, "hf", 2)
    assert run.model.max_position_embeddings == 1024 and run.model.gated_mlp and "Hugging Face config" in run.read[0]
    # the module reading assumed 64-wide heads and rotary positions; the config states both, so nothing says so
    assert not any(a.startswith(("heads of", "no position table")) for a in run.assumed)


def test_an_unreadable_model_says_so_in_one_line(tmp_path: Path) -> None:
    conv = torch.nn.Sequential(torch.nn.Conv1d(8, 8, 3), torch.nn.ReLU(), torch.nn.Conv1d(8, 8, 3))
    prefix = tmp_path / "profiled"
    write_profile(prefix, conv, [])
    with pytest.raises(ValueError, match="cannot read this model's structure \\(no repeated block") as err:
        read_profiled(prefix, "conv", 2)
    assert "\n" not in str(err.value)


def _conv_net_forward_flops_per_sample() -> float:
    """The fixture's forward FLOPs per image by hand (tests/fixtures/scripts/cnn_classifier.py): each 3 x 3
    convolution 2 x C_in x C_out x 9 per output pixel (32 x 32 for the first two, then 16 x 16, 8 x 8 after each
    pooling), each linear 2 x in x out."""
    cnn = fixture_script("cnn_classifier")
    pixels = (32 * 32, 32 * 32, 16 * 16, 8 * 8)
    convs = sum(2 * a * b * 9 * p for (a, b), p in zip(zip(cnn.CHANNELS, cnn.CHANNELS[1:]), pixels))
    return convs + sum(2 * a * b for a, b in zip(cnn.FC, cnn.FC[1:]))


def test_a_model_without_transformer_blocks_is_described_by_a_stand_in_of_its_measured_costs(tmp_path: Path) -> None:
    """A CNN: no repeated block, no config. The profiling site measured its forward FLOPs and the bytes it kept for
    backward (given here as the site would write them); the stand-in holds the same parameters, runs the same
    GEMM FLOPs per sample and keeps the same bytes."""
    from zerotune.predictor.activations import layer_activation_bytes
    from zerotune.predictor.flops import layer_forward_flops
    net = fixture_script("cnn_classifier").ConvNet()
    flops, saved, batch = 4 * _conv_net_forward_flops_per_sample(), 4 * 2.9e6, 4
    prefix = tmp_path / "profiled"
    write_profile(prefix, net, [{"name": "", "shape": [4, 3, 32, 32], "dtype": "float32"}], stand_in=True,
                   model_forward_flops=flops, model_saved_bytes=saved, train_micro_batch_size_per_gpu=batch)
    run = read_profiled(prefix, "cnn", 2)
    spec, counted = run.model, sum(p.numel() for p in net.parameters())
    assert run.num_params == counted and abs(spec.num_params - counted) / counted < 1e-3
    assert run.micro_batch == batch and run.seq_len == spec.max_position_embeddings
    stand_in_flops = spec.num_layers * layer_forward_flops(spec, 1, run.seq_len)  # per sample
    assert stand_in_flops == pytest.approx(flops / batch, rel=0.03)  # positions are whole: rounding only
    kept = spec.num_layers * layer_activation_bytes(spec, batch, run.seq_len, 4)
    assert kept == pytest.approx(saved, rel=1e-3)
    assert any(r.startswith("no repeated transformer block") for r in run.read)
    assert load_model(profiled_yaml(tmp_path, run)).num_params == spec.num_params


def test_blocks_of_mlps_alone_are_described_by_the_stand_in_not_given_attention(tmp_path: Path) -> None:
    """tests/fixtures/scripts/mlp_regression.py: an nn.Sequential of residual MLP blocks over feature vectors. Its
    blocks repeat, but hold no attention: read as transformer blocks they were given four h x h projections each
    (a 50M-parameter MLP of this kind described as 75M) and, with no token or sequence input, the tune stopped
    asking for --seq_len. Now the description says the block has no attention, and the model's measured costs
    describe it: its parameters, one position per sample, its forward FLOPs."""
    from zerotune.calibrate.inspect_model import readable
    from zerotune.predictor.flops import layer_forward_flops
    module = fixture_script("mlp_regression")
    net = module.Regressor()
    doc = describe(net)
    assert doc["structure"] is None and "no attention" in doc["error"] and not readable(doc)
    assert not doc["read"] and not doc["assumed"]  # no notes of a structure that was not kept (heads, embeddings)
    batch = 4
    per_sample = module.BLOCKS * 2 * 2 * module.FEATURES * module.FFN + 2 * module.FEATURES
    prefix = tmp_path / "profiled"
    write_profile(prefix, net, [{"name": "", "shape": [batch, module.FEATURES], "dtype": "float32"}],
                   stand_in=True, model_forward_flops=batch * per_sample, model_saved_bytes=batch * 1.6e5,
                   train_micro_batch_size_per_gpu=batch)
    run = read_profiled(prefix, "mlp", 2)
    counted = sum(p.numel() for p in net.parameters())
    assert abs(run.model.num_params - counted) / counted < 0.01
    assert run.seq_len == 1 and run.micro_batch == batch
    assert run.model.num_layers * layer_forward_flops(run.model, 1, 1) == pytest.approx(per_sample, rel=0.03)


def test_a_nanogpt_style_final_norm_is_read_inside_a_module_named_transformer() -> None:
    """tests/fixtures/scripts/nanogpt_loop.py keeps its blocks and final norm in `transformer` (wte, wpe, h, ln_f):
    the final norm's name contains "transform", by which BERT's head transform (cls.predictions.transform.LayerNorm)
    was told apart, so it had been read as having none."""
    module = fixture_script("nanogpt_loop")
    doc = describe(module.GPT())
    s = doc["structure"]
    assert (s["num_layers"], s["hidden_size"], s["num_heads"], s["ffn_hidden_size"], s["vocab_size"]) == \
        (module.LAYERS, module.WIDTH, module.HEADS, 4 * module.WIDTH, module.VOCAB)
    assert s["final_norm"] and not s["embedding_norm"] and s["tied_embeddings"]
    assert doc["num_params"] == sum(p.numel() for p in module.GPT().parameters())
    transformers = pytest.importorskip("transformers")
    bert = transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2,
                                                                num_attention_heads=4, intermediate_size=256))
    assert not describe(bert)["structure"]["final_norm"]  # post-LN: the head transform's norm is the head's


def test_distilberts_config_width_key_is_read(tmp_path: Path) -> None:
    """DistilBERT states its width as `dim`: its config was skipped ("without a vocabulary") and the modules read
    instead. The key lists of the catalog and of the file that runs in the user's process agree."""
    from zerotune.calibrate import inspect_model
    from zerotune.predictor.hf_config import HF_WIDTH_KEYS
    assert inspect_model.HF_WIDTH_KEYS == HF_WIDTH_KEYS and "dim" in HF_WIDTH_KEYS
    transformers = pytest.importorskip("transformers")
    config = transformers.DistilBertConfig(vocab_size=3000, dim=128, n_layers=2, n_heads=4, hidden_dim=512)
    model = transformers.DistilBertForSequenceClassification(config)
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "input_ids", "shape": [2, 64], "dtype": "int64"}])
    run = read_profiled(prefix, "distilbert", 2)
    assert run.read[0].startswith("Hugging Face config (model_type distilbert) of the engine's module")
    m = run.model
    assert (m.num_layers, m.hidden_size, m.num_heads, m.ffn_hidden_size, m.vocab_size) == (2, 128, 4, 512, 3000)


def test_the_site_counts_a_whole_models_forward_flops_and_saved_bytes_once() -> None:
    """What the stand-in is built from, counted as the profiling site counts it in the user's process: the CNN
    fixture's first forward FLOPs equal the hand count (torch's FlopCounterMode), later forwards are not counted,
    and the whole model's saved bytes are at least its activations' outputs."""
    spec = importlib.util.spec_from_file_location("zt_site_flops", PROFILING_SITE / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(site)  # type: ignore[union-attr]
    net = fixture_script("cnn_classifier").ConvNet()
    state = {"model_saved_bytes": 0, "model_saved_calls": 0, "model_forward_flops": 0}
    site._counts().count_saved(net, net, state, "model")
    site._counts().count_flops(net, state)
    images = torch.randn(3, 3, 32, 32)
    net(images).sum().backward()
    first = dict(state)
    net(images).sum().backward()
    assert state == first  # only the first forward is counted
    assert first["model_forward_flops"] == 3 * _conv_net_forward_flops_per_sample()
    # every ReLU output of the first convolution alone is 64 x 32 x 32 floats per image
    assert first["model_saved_bytes"] > 3 * 64 * 32 * 32 * 4


def test_a_model_without_transformer_blocks_and_no_measured_costs_says_so_in_one_line(tmp_path: Path) -> None:
    prefix = tmp_path / "profiled"
    write_profile(prefix, fixture_script("cnn_classifier").ConvNet(), [], stand_in=True)
    with pytest.raises(ValueError, match="its forward's FLOPs and saved bytes were not measured") as err:
        read_profiled(prefix, "cnn", 2)
    assert "\n" not in str(err.value)


def test_a_list_of_bare_linears_is_not_a_repeated_block() -> None:
    from zerotune.calibrate.inspect_model import find_blocks
    assert find_blocks(fixture_script("cnn_classifier").ConvNet()) is None


def test_profiling_env_puts_the_site_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/user/lib")
    env = profiling_env({"DS_ACCELERATOR": "cpu"}, Path("/r/profiled"))
    assert env["PYTHONPATH"].split(":") == [str(PROFILING_SITE), "/user/lib"]
    assert env["ZEROTUNE_PROFILE_OUT"] == "/r/profiled" and env["DS_ACCELERATOR"] == "cpu"


def test_an_experiments_ranks_write_their_peak_memory_as_they_exit(tmp_path: Path) -> None:
    """`tune`'s experiments run with the site first on PYTHONPATH and ZEROTUNE_PEAK_OUT set (validate.runs): nothing
    is patched, and each rank writes its peak when the process exits (DeepSpeed's engine ends an autotuning
    experiment with exit()); the experiment's peak is the largest rank's. Here two 'ranks' import DeepSpeed and
    exit(); a process that never imported DeepSpeed writes nothing. (On the CPU the peak is getrusage's, which a
    child inherits from the process it was forked from, so the two are not compared here.)"""
    import subprocess
    import sys
    prefix = tmp_path / "peak"
    for rank, code in ((0, "import deepspeed; exit()"), (1, "import deepspeed, torch; torch.ones(2**20).add_(1)"),
                       (2, "import json")):
        env = {**peak_env({"DS_ACCELERATOR": "cpu", "RANK": str(rank)}, prefix), "PATH": "/usr/bin:/bin"}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
    docs = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("peak.rank*.json")}
    assert set(docs) == {"peak.rank0.json", "peak.rank1.json"}
    assert {d["peak_memory_kind"] for d in docs.values()} == {"RSS"}
    assert all(d["peak_memory_bytes"] > 2**20 for d in docs.values())
    assert read_peak_bytes(prefix) == max(d["peak_memory_bytes"] for d in docs.values())
    assert read_peak_bytes(tmp_path / "never_ran") is None
    assert peak_env({}, prefix)["PYTHONPATH"].split(":")[0] == str(PROFILING_SITE)


_PROBE_THEN_IMPORT = """
import importlib.util, sys
assert importlib.util.find_spec("deepspeed") is not None  # transformers' is_deepspeed_available, before the import
import deepspeed
print(hasattr(deepspeed.initialize, "__wrapped__"))
"""


def test_the_hook_survives_an_availability_check_before_the_import(tmp_path: Path) -> None:
    """The Hugging Face Trainer asks importlib.util.find_spec("deepspeed") long before importing it (seen: the
    profiling run of a Trainer script wrote no model file)."""
    import subprocess
    import sys
    env = {**profiling_env({"DS_ACCELERATOR": "cpu"}, tmp_path / "profiled"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", _PROBE_THEN_IMPORT], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"


def test_hugging_face_masked_lm_keeps_its_head_from_the_modules(tmp_path: Path) -> None:
    """BertForMaskedLM: the config (model_type bert) says 'pooler'; the modules have an MLM head and no pooler."""
    pytest.importorskip("transformers")
    module = fixture_script("hf_trainer_mlm")
    from transformers import BertConfig, BertForMaskedLM
    model = BertForMaskedLM(BertConfig(vocab_size=module.VOCAB, hidden_size=module.HIDDEN, num_hidden_layers=module.LAYERS,
                                       num_attention_heads=module.HEADS, intermediate_size=module.FFN,
                                       max_position_embeddings=module.POSITIONS))
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "input_ids", "shape": [2, module.SEQ], "dtype": "int64"}])
    run = read_profiled(prefix, "hf-bert", 2)
    m = run.model
    assert (m.num_layers, m.hidden_size, m.num_heads, m.ffn_hidden_size, m.vocab_size) == (3, 320, 5, 1280, 5000)
    assert (m.head, m.tied_embeddings, m.head_transform, m.head_bias) == ("lm", True, True, True)
    assert m.num_params == sum(p.numel() for p in model.parameters())  # every tensor, counted once
    # ZeRO-3 hooks every module that runs: BertLayer holds 18 (the layer, BertAttention, BertSelfAttention and its
    # q / k / v and dropout, BertSelfOutput's dense, LayerNorm and dropout, BertIntermediate's dense and GELU,
    # BertOutput's dense, LayerNorm and dropout); outside the blocks every module but the ModuleList
    called = [x for x in model.modules() if type(x).__name__ not in ("ModuleList", "ModuleDict")]
    assert m.hooked_modules_per_layer == 18
    assert m.num_layers * m.hooked_modules_per_layer + m.hooked_outer_modules == len(called)


class _BarePositionsLM(torch.nn.Module):
    """A token model whose learned positions are a parameter of its own, not an nn.Embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(3000, 128), torch.nn.Parameter(torch.zeros(1, 96, 128))
        self.blocks = torch.nn.ModuleList([torch.nn.TransformerEncoderLayer(128, 4, 512, batch_first=True)
                                           for _ in range(2)])


def test_learned_positions_held_as_a_bare_parameter_are_read(tmp_path: Path) -> None:
    """`self.pos = nn.Parameter(torch.zeros(1, S, h))`: read as 'no position table', its S x h parameters left out
    of the description (3,630,336 of a script's 3,663,104)."""
    model = _BarePositionsLM()
    s = describe(model)["structure"]
    assert (s["position_embedding"], s["max_position_embeddings"]) == ("learned", 96)
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "", "shape": [2, 96], "dtype": "int64"}])
    run = read_profiled(prefix, "bare-positions", 2)
    assert run.model.num_params == pytest.approx(sum(p.numel() for p in model.parameters()), abs=512)


def test_integer_targets_after_frames_are_not_read_as_tokens() -> None:
    """A speech model's forward(frames (b, 300, 80) float, labels (b, 40) int64): its labels were read as 40 tokens
    and paced the padded lengths; after a float input of 3 or more dimensions no integer tensor is the input."""
    from zerotune.validate.profiled_inputs import token_input as _token_input
    frames = {"name": "", "shape": [1, 300, 80], "dtype": "float32"}
    labels = {"name": "", "shape": [1, 40], "dtype": "int64"}
    assert _token_input([frames, labels]) is None
    assert _token_input([labels, frames]) == (1, 40)  # ids first: a token model given extra features
