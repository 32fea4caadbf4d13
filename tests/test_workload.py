"""zerotune.calibrate.workload builds the model the predictor models: the same tensors, so the same parameter count."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerotune.predictor import load_model

torch = pytest.importorskip("torch")
workload = pytest.importorskip("zerotune.calibrate.workload")

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("name, published", [
    ("gpt2", 124_439_808),             # GPT2LMHeadModel num_parameters() (data/models/gpt2.yaml source)
    ("zt-gpt-small", 30_339_456),      # the built-in workload model
    ("distilbert-base", 66_362_880),   # embedding norm, no final norm, no head
    ("bert-base", 109_482_240),        # token types and pooler
])
def test_torch_parameter_count_equals_model_spec(name: str, published: int) -> None:
    spec = load_model(name)
    model = workload.build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.num_params == published


def test_llama_style_spec_has_the_same_tensors() -> None:
    # grouped-query attention (8 heads, 2 K/V heads), SwiGLU, RMSNorm, no biases, untied head
    spec = load_model(str(FIXTURES / "tiny-llama.yaml"))
    model = workload.build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.num_params == 152_384
    sizes = sorted(p.numel() for p in model.parameters())
    assert sizes == sorted(t.num_elems for t in spec.tensors())  # tensor by tensor, as ZeRO-3 partitions them


def test_heads_wider_than_hidden_over_heads_have_the_same_tensors_and_run() -> None:
    # Qwen3-0.6B's shape in small: 4 heads of 128 over hidden 256 (attention_head_dim), 2 K/V heads
    spec = load_model(str(FIXTURES / "tiny-llama.yaml")).replace(hidden_size=256, num_heads=4, num_kv_heads=2,
                                                                  attention_head_dim=128)
    model = workload.build_model(spec)
    assert sorted(p.numel() for p in model.parameters()) == sorted(t.num_elems for t in spec.tensors())
    loss = model(torch.randint(0, spec.vocab_size, (2, 17)))
    loss.backward()
    assert torch.isfinite(loss)


def test_llama_2_7b_block_matches_the_spec() -> None:
    spec = load_model("llama-2-7b").replace(num_layers=1)  # one block of the real width, still ~0.46 B params
    block = workload.Block(spec)
    assert sum(p.numel() for p in block.parameters()) == spec.num_layer_params == 202_383_360


def test_forward_gives_a_finite_loss_near_log_vocab() -> None:
    spec = load_model(str(FIXTURES / "tiny-gpt.yaml"))
    torch.manual_seed(0)
    model = workload.build_model(spec, checkpoint_blocks=True)
    batch = torch.randint(0, spec.vocab_size, (2, 17))
    loss = model(batch)
    loss.backward()
    # random weights predict close to uniformly: cross-entropy ~ ln(512) = 6.24 (tolerance for init noise)
    assert float(loss.detach()) == pytest.approx(6.24, abs=0.5)
    assert all(p.grad is not None for p in model.parameters())


def test_deberta_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="relative-position"):
        workload.build_model(load_model("deberta-v2-xlarge").replace(num_layers=1))


def test_timer_means_are_seconds_per_micro_step() -> None:
    # DeepSpeed's global timers in ms, summed over gas=2 micro-steps; step is per optimizer step
    samples = [{"fwd": 100.0, "bwd": 300.0, "step": 50.0}, {"fwd": 140.0, "bwd": 260.0, "step": 70.0}]
    means = workload._timer_means_s(samples, gas=2)
    assert means == pytest.approx({"forward_s": 0.06, "backward_s": 0.14, "optimizer_s": 0.06})
