"""The operator-level micro-step model (predictor/ops.py): FLOPs, GEMM shape curve, vectorisation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import yaml

from zerotune.predictor import DSConfig
from zerotune.predictor.catalog import data_dir, list_hardware, load_hardware, load_model
from zerotune.predictor.dsconfig import ActivationCheckpointing
from zerotune.predictor.flops import micro_batch_flops
from zerotune.predictor.job import Efficiency
from zerotune.predictor.model import ModelSpec
from zerotune.predictor.ops import (MHA_CROSS_RW_ELEMS, MHA_RW_ELEMS, MISALIGNED_GEMM_SLOWDOWN, _linear, cold_weight_s,
                                    device_rates, gemm_s, layer_times, outer_times)
from zerotune.predictor.step_time import compute_times
from tests.conftest import make_job


@pytest.mark.parametrize("name, cross", [("gpt2", 0), ("bert-base", 0), ("llama-2-7b", 0), ("distilbert-base", 0),
                                         ("gpt2", 5)])
@pytest.mark.parametrize("tp", [1, 2])
def test_op_flops_add_up_to_flops_py(name: str, cross: int, tp: int) -> None:
    # One formula, one place: the kernels' FLOPs are flops.py's count of the same micro-batch, split over tp (also
    # with an encoder-decoder's cross-attention in 5 of the 12 blocks).
    model = load_model(name).replace(cross_attention_layers=cross)
    rates = device_rates(load_hardware("a100-80gb"), "bf16", Efficiency())
    b, s = 3, 512
    block, outer = layer_times(model, b, s, tp, rates), outer_times(model, b, s, tp, rates, True)
    count = micro_batch_flops(model, b, s, recompute=False)
    ops_forward = model.num_layers * block.forward_flops + outer.forward_flops
    ops_backward = model.num_layers * block.backward_flops + outer.backward_flops
    assert ops_forward == pytest.approx(count.forward_flops / tp, rel=1e-12)
    assert ops_backward == pytest.approx(count.backward_flops / tp, rel=1e-12)


def test_large_gemm_reaches_the_measured_h100_figure() -> None:
    # zerotune's own H100 microbenchmarks (data/profiles/h100-80gb.json): torch.matmul bf16 2048x2048x8192 at
    # 100.7 us (682 TFLOP/s), 4096^3 at 208.0 us (661). With the calibration's scale at 1 the model runs them
    # at the catalog's MAMF (794.5) less wave quantization; plain torch.matmul reaches 83-86% of that (the
    # uncalibrated gemm_efficiency_scale, 0.7, is lower: it also carries training shapes and the rest of a step).
    rates = device_rates(load_hardware("h100-80gb"), "bf16", Efficiency(gemm_efficiency_scale=1.0))
    assert float(gemm_s(2048, 2048, 8192, 1, rates)) == pytest.approx(100.7e-6, rel=0.2)
    assert float(gemm_s(4096, 4096, 4096, 1, rates)) == pytest.approx(208.0e-6, rel=0.2)


def test_small_gemms_fall_below_peak_by_waves_and_memory() -> None:
    rates = device_rates(load_hardware("a100-80gb"), "fp16", Efficiency(gemm_efficiency_scale=1.0))
    rate = lambda m, n, k: 2.0 * m * n * k / float(gemm_s(m, n, k, 1, rates))  # noqa: E731
    big = rate(8192, 8192, 8192)
    assert big == pytest.approx(rates.matmul_flops_per_s, rel=0.02)
    # 128 output tiles on 108 SMs: two waves, the second 20/108 full -> 128 / 216 of the rate
    assert rate(2048, 1024, 8192) == pytest.approx(big * 128 / 216, rel=0.02)
    # a skinny GEMM (k = 64) is bound by its bytes, far below the tensor-core rate
    assert rate(4096, 4096, 64) < 0.5 * big


@pytest.mark.parametrize("pp", [1, 2])
def test_vectorised_over_micro_batches_matches_one_at_a_time(pp: int) -> None:
    job = make_job("gpt2-medium", "v100-32gb", 1, 16, 1024)
    cfg = DSConfig(precision="fp16", activation_checkpointing=ActivationCheckpointing(enabled=True), pp_size=pp)
    sizes = np.array([1.0, 2.0, 3.0, 8.0, 17.0])
    columns = compute_times(job, cfg, Efficiency(), sizes)
    for i, b in enumerate(sizes):
        one = compute_times(job, cfg.replace(train_micro_batch_size_per_gpu=int(b)), Efficiency())
        for col, value in zip(columns, one):
            assert col[i] == pytest.approx(float(value), rel=1e-12)


def test_small_micro_batches_are_host_bound() -> None:
    # vTrain (fit half): a 1024-wide GPT block took ~2.5 ms per micro-step at micro-batch 1 on an A100 against
    # ~0.5 ms of math; the kernels' launches, not their math, set the time there.
    job = make_job("gpt2-medium", "a100-80gb", 1, 1, 1024)
    cfg = DSConfig(precision="fp16")
    fwd_1, _, _, _ = compute_times(job, cfg, Efficiency(), 1)
    fwd_2, _, _, _ = compute_times(job, cfg, Efficiency(), 2)
    assert float(fwd_2) < 1.2 * float(fwd_1)
    fast_host = Efficiency(kernel_launch_s=1e-7)
    assert float(compute_times(job, cfg, fast_host, 1)[0]) < 0.5 * float(fwd_1)


def test_gelu_new_costs_more_than_fused_gelu() -> None:
    model = load_model("gpt2-large")
    rates = device_rates(load_hardware("v100-32gb"), "fp16", Efficiency())
    eager = layer_times(model, 3, 1024, 1, rates)
    fused = layer_times(model.replace(activation="gelu"), 3, 1024, 1, rates)
    assert eager.forward_s > fused.forward_s and eager.backward_s > fused.backward_s
    assert eager.forward_flops == fused.forward_flops


@pytest.mark.parametrize("name", list_hardware())
def test_catalog_achievable_figures_are_below_the_datasheet_and_sourced(name: str) -> None:
    hw = load_hardware(name)
    assert set(hw.matmul_flops) == set(hw.peak_flops)
    for precision, rate in hw.matmul_flops.items():
        assert 0 < rate <= hw.peak_flops[precision], precision
    assert 0 < hw.achievable_memory_bandwidth_bytes_per_s <= hw.memory_bandwidth_bytes_per_s
    assert 0 < hw.kernel_launch_s < 1e-3 and hw.num_compute_units >= 1
    assert len(hw.achievable_source) > 40
    if hw.flash_attention_flops_per_s:  # a fused attention kernel's rate: below the 16-bit peak, with its source
        peak = max(hw.peak_flops.get("bf16", 0), hw.peak_flops.get("fp16", 0))
        assert 0 < hw.flash_attention_flops_per_s <= peak
        assert "flash_attention_source" in yaml.safe_load((data_dir() / "hardware" / f"{name}.yaml").read_text())


def test_catalog_rejects_a_matmul_figure_for_a_precision_without_a_peak(tmp_path) -> None:
    text = (data_dir() / "hardware" / "v100-32gb.yaml").read_text().replace("bf16_matmul_tflops: null",
                                                                             "bf16_matmul_tflops: 50")
    path = tmp_path / "v100-bf16.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="matmul_tflops must be given for exactly the precisions with a peak"):
        load_hardware(str(path))


def test_disentangled_attention_costs_deberta_its_relative_position_work() -> None:
    # DeBERTa-v2's c2p / p2c matmuls (s x 2k per head) and their gathers over s x s run beside the content
    # scores; without them zerotune predicted deberta-v2-xxlarge 1.7-2.0x the throughput measured on 16 V100
    # (ds_autotuning_hf_v100.jsonl, fit half). A GPT-style block of the same widths has none of that work.
    model = load_model("deberta-v2-xxlarge")
    rates = device_rates(load_hardware("v100-32gb"), "fp16", Efficiency())
    plain = layer_times(model.replace(relative_position_buckets=0), 11, 256, 1, rates)
    deberta = layer_times(model, 11, 256, 1, rates)
    assert deberta.forward_flops == plain.forward_flops  # model FLOPs: what MFU counts
    assert 1.2 < float(deberta.forward_s) / float(plain.forward_s) < 1.6
    assert 1.1 < float(deberta.backward_s) / float(plain.backward_s) < 1.5
    assert deberta.forward_kernels > plain.forward_kernels


def test_a_cpu_pads_a_dimension_to_its_register_tiles_a_gpu_to_its_thread_block_tiles() -> None:
    # data/hardware/cpu.yaml gemm_tile_elems 16 (AMX tiles of 16 rows, 16-lane AVX-512 vectors): 129 rows cost
    # 9 tiles of 16, 144 rows' work for 128. On an A100, 128 x 128 thread-block tiles (cuBLAS/CUTLASS): 136 rows (a
    # multiple of 8, so the tensor cores' alignment does not enter) pad to 256, and 108 columns of tiles twice over
    # take two waves of the 108 SMs where 128 rows take one.
    cpu = device_rates(load_hardware("cpu"), "fp32", Efficiency())
    ratio = gemm_s(129, 384, 384, 1, cpu) / gemm_s(128, 384, 384, 1, cpu)
    assert ratio == pytest.approx(144 / 128, rel=0.01)  # ceil(129 / 16) x 16 rows of work for 128
    gpu = device_rates(load_hardware("a100-80gb"), "fp16", Efficiency())
    assert gpu.tile_elems == 128 and cpu.tile_elems == 16
    assert gemm_s(136, 128 * 108, 4096, 1, gpu) == pytest.approx(2 * gemm_s(128, 128 * 108, 4096, 1, gpu), rel=0.01)


def test_a_16_bit_gemm_with_a_dimension_off_the_tensor_cores_alignment_runs_at_half_pace() -> None:
    # ops.TENSOR_CORE_ALIGN_BYTES: M, N, K multiples of 8 fp16 / bf16 elements; ops.MISALIGNED_GEMM_SLOWDOWN from
    # nanoGPT's GPT-2 head (50,257 -> 50,304 rows: ~25% faster training, the head ~1.9x slower misaligned).
    # Compute-bound shapes whose tiles fill the same 10 waves of the A100's 108 SMs on both sides
    gpu = device_rates(load_hardware("a100-80gb"), "bf16", Efficiency())
    assert gpu.align_elems == 8
    aligned = gemm_s(4096, 4096, 4096, 1, gpu)
    for m, n, k in ((4096, 4096, 4095), (4096, 4095, 4096), (4097, 4096, 4096)):
        ratio = gemm_s(m, n, k, 1, gpu) / aligned
        assert ratio == pytest.approx(MISALIGNED_GEMM_SLOWDOWN * k / 4096, rel=0.01), (m, n, k)
    assert gemm_s(4104, 4096, 4096, 1, gpu) / aligned == pytest.approx(1.0, rel=0.01)  # 4104 = 513 x 8
    # fp32 runs on CUDA cores (no tensor-core rule); a CPU has none; an H100's fp16 has the same rule
    for hw, precision in (("a100-80gb", "fp32"), ("cpu", "fp32"), ("cpu", "bf16")):
        rates = device_rates(load_hardware(hw), precision, Efficiency())
        assert rates.align_elems == 0
        assert gemm_s(512, 512, 511, 1, rates) == pytest.approx(gemm_s(512, 512, 512, 1, rates) * 511 / 512, rel=0.02)
    assert device_rates(load_hardware("h100-80gb"), "fp16", Efficiency()).align_elems == 8


def test_megatron_pads_the_vocabulary_so_its_head_stays_aligned_a_hugging_face_model_does_not() -> None:
    # megatron/tokenizer/tokenizer.py _vocab_size_with_padding: up to a multiple of 128 x the tensor-parallel degree
    gpt = ModelSpec(name="g", num_layers=2, hidden_size=1024, num_heads=16, num_kv_heads=16, ffn_hidden_size=4096,
                    vocab_size=50257, max_position_embeddings=1024)
    megatron = gpt.replace(vocab_padding_multiple=128)
    assert gpt.padded_vocab(2) == 50257
    assert [megatron.padded_vocab(tp) for tp in (1, 2, 4, 8)] == [50304, 50432, 50688, 51200]
    gpu = device_rates(load_hardware("a100-80gb"), "fp16", Efficiency())
    hf, mg = outer_times(gpt, 8, 1024, 1, gpu, False), outer_times(megatron, 8, 1024, 1, gpu, False)
    assert mg.forward_flops == pytest.approx(hf.forward_flops * 50304 / 50257)  # the padded rows are computed
    assert 1.6 < float(hf.forward_s) / float(mg.forward_s) < 2.0  # the unpadded head runs misaligned


def test_one_more_token_moves_a_cpu_step_by_about_its_share() -> None:
    # The built-in workload shifts its next-token targets inside the model, so its input has 129 tokens where 128 are
    # computed (the profiling run now takes the 128 from the first block's input; a user gives --seq_len as he
    # likes); with 128-element tiles that one token made the micro-step 1.65x (the calibrated step
    # 0.812 -> 1.047 s). With 16-row tiles it costs at most the 144 / 128 of the token-dimension GEMMs.
    cfg = DSConfig(precision="fp32", train_micro_batch_size_per_gpu=1)
    steps = [compute_times(make_job("zt-gpt-small", "cpu", 1, 2, seq_len=s), cfg, Efficiency()) for s in (128, 129)]
    assert 129 / 128 <= sum(steps[1][:3]) / sum(steps[0][:3]) <= 144 / 128


@pytest.mark.parametrize("value", ["16.5", "0", "'16'"])
def test_gemm_tile_is_a_whole_number_of_elements(tmp_path, value: str) -> None:
    text = (data_dir() / "hardware" / "cpu.yaml").read_text().replace("gemm_tile_elems: 16", f"gemm_tile_elems: {value}")
    (tmp_path / "hw.yaml").write_text(text)
    with pytest.raises(ValueError, match="gemm_tile_elems") as err:
        load_hardware(str(tmp_path / "hw.yaml"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("dtype_name, element_bytes", [("bfloat16", 2), ("float32", 4)])
def test_rms_norm_and_rotary_bytes_are_what_transformers_runs(dtype_name: str, element_bytes: int) -> None:
    # ops.py's eager RMSNorm and rotary charges against a live count of the aten ops transformers' LlamaRMSNorm and
    # apply_rotary_pos_emb dispatch, forward and backward: bytes of every tensor each op reads and writes, and the
    # ops themselves (each a kernel the host launches; views launch none)
    torch = pytest.importorskip("torch")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from zerotune.predictor.ops import DeviceRates, _norm, _rotary

    class Bytes(TorchDispatchMode):
        def __init__(self, smallest: int) -> None:
            super().__init__()
            self.moved, self.smallest, self.kernels = 0, smallest, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            if not func._schema.is_mutable and not any(a.alias_info for a in func._schema.returns):
                self.moved += sum(t.numel() * t.element_size() for t in tensors if t.numel() >= self.smallest)
                self.kernels += 1  # a view launches nothing
            return out

    dtype = getattr(torch, dtype_name)
    rates = DeviceRates(1.0, 1.0, 0.0, 1, element_bytes)
    tokens, hidden = 512, 256
    x = torch.randn(tokens, hidden, dtype=dtype, requires_grad=True)
    norm_module = llama.LlamaRMSNorm(hidden).to(dtype)
    with Bytes(tokens * hidden // 2) as fwd:
        y = norm_module(x)
    grad = torch.ones_like(y)
    with Bytes(tokens * hidden // 2) as bwd:
        y.backward(grad)
    model = load_model("llama-2-7b")
    *norm_s, norm_kf, norm_kb = _norm(1.0, model, rates)
    norm = tuple(float(t) for t in norm_s)  # bytes per element: one element at 1 byte/s
    assert norm == pytest.approx((fwd.moved / x.numel(), bwd.moved / x.numel()), rel=0.02)
    assert (norm_kf, norm_kb) == (fwd.kernels, bwd.kernels)  # the host launches each one

    heads, kv_heads, seq, d = 4, 2, 128, 64
    q = torch.randn(1, heads, seq, d, dtype=dtype, requires_grad=True)
    k = torch.randn(1, kv_heads, seq, d, dtype=dtype, requires_grad=True)
    cos, sin = torch.randn(1, seq, d, dtype=dtype), torch.randn(1, seq, d, dtype=dtype)
    with Bytes(k.numel() // 2) as fwd:
        qe, ke = llama.apply_rotary_pos_emb(q, k, cos, sin)
    gq, gk = torch.ones_like(qe), torch.ones_like(ke)
    with Bytes(k.numel() // 2) as bwd:
        torch.autograd.backward([qe, ke], [gq, gk])
    shape = model.replace(hidden_size=heads * d, num_heads=heads, num_kv_heads=kv_heads)
    *rope_s, rope_kf, rope_kb = _rotary(shape, seq, 1, rates)
    rope = tuple(float(t) for t in rope_s)
    assert rope == pytest.approx((fwd.moved, bwd.moved), rel=0.1)
    assert (rope_kf, rope_kb) == (fwd.kernels, bwd.kernels)


def test_a_causal_flash_kernel_skips_the_tiles_above_the_diagonal() -> None:
    # FlashAttention-2 sec. 3.1.1: (n + 1) / 2n of the tiles for n query blocks of 128; an encoder and a model that
    # adds ALiBi biases to its scores (llm-foundry's MPT, position_embedding "none") pay for all of them
    from zerotune.predictor.ops import causal_flash_share
    llama = load_model("llama-2-7b")
    assert causal_flash_share(llama, 1024) == pytest.approx(9 / 16)
    assert causal_flash_share(llama, 64) == 1.0
    assert causal_flash_share(llama.replace(position_embedding="none"), 1024) == 1.0
    assert causal_flash_share(load_model("bert-base"), 1024) == 1.0


def test_a_cpu_rank_pays_for_its_dropout_masks_random_numbers_and_a_gpu_only_for_their_bytes() -> None:
    """Source: data/hardware/cpu.yaml dropout_rng_source (torch 2.13 on this project's CPU: dropout 10-22 ns an
    element, a copy under 1 ns; the encoder fixture's forward 90-130 ms longer with dropout 0.1 than 0 at micro-batch
    4). Each block draws a mask for its two residual dropouts (hidden elements each) and, under eager attention, one
    for the attention probabilities (heads x s x s per sample); backward only multiplies by the masks."""
    model = load_model("bert-base").replace(attention="eager", dropout=True)
    b, s, h, heads = 4, 128, model.hidden_size, model.num_heads
    cpu = device_rates(load_hardware("cpu"), "fp32", Efficiency())
    assert cpu.rng_s_per_element == pytest.approx(15e-9)
    with_drop, without = layer_times(model, b, s, 1, cpu), layer_times(model.replace(dropout=False), b, s, 1, cpu)
    masked = 2 * b * s * h + b * heads * s * s
    bytes_only = layer_times(model, b, s, 1, replace(cpu, rng_s_per_element=0.0))
    assert with_drop.forward_s - bytes_only.forward_s == pytest.approx(masked * 15e-9, rel=1e-6)
    assert with_drop.backward_s == pytest.approx(bytes_only.backward_s) and with_drop.forward_s > without.forward_s
    gpu = device_rates(load_hardware("h100-80gb"), "bf16", Efficiency())
    assert gpu.rng_s_per_element == 0.0  # drawn inside the kernel: bytes only


def test_a_fused_cross_entropy_passes_over_the_logits_once_each_way() -> None:
    # flash-attn's CrossEntropyLoss: forward reads the 16-bit logits once (loss and log-sum-exp), backward reads
    # them and writes their gradient; Hugging Face's eager loss copies and log-softmaxes them (2 + 2 passes
    # forward, 3 + 2 backward). At 8 x 2048 tokens and a 50,368 vocabulary the head's GEMMs are the same.
    hw = load_hardware("h100-80gb")
    model = load_model("gpt2").replace(vocab_size=50368, max_position_embeddings=2048)
    rates = device_rates(hw, "bf16", Efficiency())
    eager = outer_times(model, 8, 2048, 1, rates, False)
    fused = outer_times(model.replace(cross_entropy="fused"), 8, 2048, 1, rates, False)
    logits_bytes = 8 * 2048 * 50368 * 2
    assert eager.forward_s - fused.forward_s == pytest.approx(3 * logits_bytes / rates.memory_bytes_per_s, rel=1e-6)
    assert eager.backward_s - fused.backward_s == pytest.approx(3 * logits_bytes / rates.memory_bytes_per_s, rel=1e-6)
    assert fused.forward_flops == eager.forward_flops


def test_subnormal_logit_gradients_slow_the_heads_backward_gemms_on_the_cpu_only() -> None:
    # data/hardware/cpu.yaml subnormal_gemm_slowdown: this CPU multiplied a 1280 x 8192 logits' gradient with 3.27%
    # subnormal values by its weight at 24 GFLOP/s against 179 for a normal one (x7.5 = 1 + 195 x 0.0327). The
    # head's two backward GEMMs take that gradient as an operand; its forward and the blocks are untouched.
    base = replace(load_model("gpt2"), logits_grad_subnormal_share=0.0)
    sub = replace(base, logits_grad_subnormal_share=0.0327)
    cpu = device_rates(load_hardware("cpu"), "fp32", Efficiency())
    plain, slowed = outer_times(base, 10, 128, 1, cpu, True), outer_times(sub, 10, 128, 1, cpu, True)
    assert slowed.forward_s == plain.forward_s
    gemm_b = float(gemm_s(1280, 768, 50257, 1, cpu) + gemm_s(768, 50257, 1280, 1, cpu))  # dX and dW of the head
    assert float(slowed.backward_s - plain.backward_s) == pytest.approx(195 * 0.0327 * gemm_b, rel=0.05)
    h100 = device_rates(load_hardware("h100-80gb"), "bf16", Efficiency())  # a GPU's FMA units take subnormals
    assert outer_times(sub, 10, 128, 1, h100, True).backward_s == outer_times(base, 10, 128, 1, h100, True).backward_s
    # the profiling run timed this host's own slowdown at the share (ModelSpec.logits_grad_subnormal_factor): it
    # replaces the catalog's linear term, x1 where the host has none (an AMD EPYC host: x1.00 at 3% and 17%)
    measured = outer_times(replace(sub, logits_grad_subnormal_factor=1.0), 10, 128, 1, cpu, True)
    assert measured.backward_s == pytest.approx(float(plain.backward_s))
    doubled = outer_times(replace(sub, logits_grad_subnormal_factor=2.0), 10, 128, 1, cpu, True)
    assert float(doubled.backward_s - plain.backward_s) == pytest.approx(gemm_b, rel=0.05)
    assert outer_times(replace(sub, logits_grad_subnormal_factor=2.0), 10, 128, 1, h100, True).backward_s == \
        outer_times(base, 10, 128, 1, h100, True).backward_s


def test_memory_bound_kernels_that_fit_the_caches_move_their_bytes_at_the_measured_cache_pace() -> None:
    # This CPU VM's copies (2026-11-27, one thread): 85-90 GB/s moving up to 1 MiB, 26-35 GB/s at 2-64 MiB, 14 at
    # 128 MiB. With that curve (gain over the 128 MiB copy) a layer at micro-batch 1 (kernels of ~100 KiB) runs its
    # memory-bound kernels about 6x as fast as the large copy says, GEMMs unchanged; kernels moving more than the
    # largest copy keep the large copy's pace
    from zerotune.predictor.ops import _elementwise
    gain = ((1.0 * 2**20, 6.1), (8.0 * 2**20, 1.86), (128.0 * 2**20, 1.0))
    cpu = load_hardware("cpu")
    plain = device_rates(cpu, "fp32", Efficiency())
    cached = device_rates(cpu, "fp32", Efficiency(memory_cache_gain=gain))
    small, large = 2**15, 2**26  # elements: 256 KiB moved (fp32, one read and one write), 512 MiB
    assert _elementwise(small, 1, 1, 0, plain) / _elementwise(small, 1, 1, 0, cached) == pytest.approx(6.1)
    assert _elementwise(large, 1, 1, 0, cached) == pytest.approx(_elementwise(large, 1, 1, 0, plain))
    mid = 2**20  # 8 MiB moved: the measured point; 4x that interpolates in log bytes toward the large copy
    assert _elementwise(mid, 1, 1, 0, plain) / _elementwise(mid, 1, 1, 0, cached) == pytest.approx(1.86)
    assert 1.0 < _elementwise(4 * mid, 1, 1, 0, plain) / _elementwise(4 * mid, 1, 1, 0, cached) < 1.86
    model = load_model("gpt2")
    fast, slow = layer_times(model, 1, 128, 1, cached), layer_times(model, 1, 128, 1, plain)
    assert fast.forward_s < slow.forward_s and fast.forward_flops == slow.forward_flops
    assert gemm_s(512, 512, 512, 1, cached) == gemm_s(512, 512, 512, 1, plain)


def test_a_cpu_tensor_past_the_mmap_threshold_pays_its_pages_faulting_in() -> None:
    """Source: data/hardware/cpu.yaml fresh_page_source (this project's CPU VM, AMD EPYC host, 2026-11-29, one
    thread, fp32, medians of 7): a clone into a fresh tensor moved 26-43 GB/s (read + write) at 8-31 MiB, as a copy
    into a kept tensor did, and 4.1-4.4 GB/s at 33-512 MiB (1.88 ns an element at 64 MiB), where the kept copy
    still moved 23-27: glibc maps every block past its mmap threshold (at most 32 MiB) anew."""
    from zerotune.predictor.ops import _elementwise, fresh_s
    cpu = device_rates(load_hardware("cpu"), "fp32", Efficiency())
    below, above = 16 * 2**20 // 4, 64 * 2**20 // 4  # elements of a 16 and a 64 MiB fp32 tensor
    assert float(fresh_s(below, 1, cpu)) == 0.0
    assert float(_elementwise(above, 1, 1, 0, cpu)) / above * 1e9 == pytest.approx(1.88, rel=0.15)
    assert float(_elementwise(below, 1, 1, 0, cpu)) / below * 1e9 < 0.5
    # a GEMM's output is such a tensor too: the GPT-2 head's logits at 4096 tokens (823 MB) pay 0.32 s on top
    logits = float(gemm_s(4096, 50257, 768, 1, cpu) - gemm_s(4096, 50257, 768, 1, replace(cpu, fresh_s_per_byte=0.0)))
    assert logits == pytest.approx(4096 * 50257 * 4 * 0.39e-9, rel=0.01)
    # the profiling run's own timing replaces the catalog's figure (a host whose allocator keeps large blocks: 0)
    kept = device_rates(load_hardware("cpu"), "fp32", Efficiency(fresh_page_s_per_byte=0.0))
    assert float(_elementwise(above, 1, 1, 0, kept)) / above * 1e9 < 0.5
    # GPUs' caching allocators keep their blocks: no such charge
    h100 = device_rates(load_hardware("h100-80gb"), "bf16", Efficiency())
    assert float(fresh_s(2**30, 1, h100)) == 0.0


def test_cpu_flash_attention_runs_per_score_at_the_fp32_rate_in_any_precision() -> None:
    """Source: data/hardware/cpu.yaml flash_score_source (this project's CPU VM, AMD EPYC host, 2026-11-29, one
    thread): scaled_dot_product_attention at head dim 64 took 3.2-3.9 ns a score forward and 8.5-9.8 backward at
    s 192-1024 in fp32, and bf16 no less (3.88 and 12.6 at s 192); is_causal skipped nothing up to s 512 and a
    quarter at 1024 (0.75-0.78 forward)."""
    from zerotune.predictor.ops import _attention
    from zerotune.predictor.job import Efficiency as Eff
    cpu = load_hardware("cpu")
    # the fp32 GEMM rate of the shipped profile's day, 95 GFLOP/s (its microbenchmark), for both precisions
    eff = Eff(gemm_efficiency_scale=95e9 / cpu.matmul_flops["fp32"], fp32_compute_scale=1.0)
    encoder = replace(load_model("bert-base"), attention="flash")  # 12 heads of 64
    for precision in ("fp32", "bf16"):
        rates = device_rates(cpu, precision, eff)
        fwd, bwd, _ = _attention(encoder, 1, 512, 1, rates)
        scores = 12 * 512 * 512
        assert float(fwd) / scores * 1e9 == pytest.approx(3.4, rel=0.15)
        assert float(bwd) / scores * 1e9 == pytest.approx(8.8, rel=0.15)
    gpt2 = replace(load_model("gpt2"), attention="flash")  # causal: whole 512-key blocks above the diagonal skipped
    rates = device_rates(cpu, "fp32", eff)
    assert float(_attention(gpt2, 1, 512, 1, rates)[0]) == pytest.approx(float(_attention(encoder, 1, 512, 1, rates)[0]))
    ratio = float(_attention(gpt2, 1, 1024, 1, rates)[0] / _attention(encoder, 1, 1024, 1, rates)[0])
    assert ratio == pytest.approx(0.765, abs=0.03)
    # a GPU's flash kernel keeps its own form: 16-bit GEMM work only, causal tiles of 128
    h100 = device_rates(load_hardware("h100-80gb"), "bf16", Efficiency())
    assert float(_attention(gpt2, 1, 1024, 1, h100)[0]) < 1e-3


def test_each_gemm_of_a_cpu_linear_reads_or_writes_its_cold_weight_once() -> None:
    """Source: `python -m benchmarks.cold_weights` on this project's CPU VM (2026-11-28, one thread, fp32): after a
    64 MiB write, each GEMM of the encoder fixture's linear shapes took longer than timed back to back by these
    copies of its weight at a cold 16 MiB copy's pace (16.3 GB/s), forward / input gradient / weight gradient, at
    128 x 384 -> 1536, 128 x 1536 -> 384, 128 x 384 -> 384, 640 x 384 -> 1536, 128 x 384 -> 8192 and 640 x 384 ->
    8192. Their median is one read or write of the weight (half a copy) within 0.1 copy, which cold_weight_s charges
    per GEMM: three for a trained weight, two for a frozen one (no weight gradient)."""
    measured = (0.69, 0.42, 0.25, 0.39, 0.17, 0.19, 0.91, 0.74, 1.00, 0.20, 0.34, 0.57, 0.44, 0.05, 0.75, -1.01, 0.80,
                0.77)
    cpu = replace(device_rates(load_hardware("cpu"), "fp32", Efficiency()), memory_bytes_per_s=16.3e9)
    copy_s = 2 * 4 * 384 * 1536 / 16.3e9
    assert cold_weight_s(384, 1536, cpu) / copy_s == pytest.approx(float(np.median(measured)), abs=0.1)
    trained, frozen = _linear(128, 384, 1536, cpu), _linear(128, 384, 1536, cpu, weight_grad=0.0)
    plain = replace(cpu, packs_weights=False)
    assert trained[1] - _linear(128, 384, 1536, plain)[1] == pytest.approx(2 * cold_weight_s(384, 1536, cpu))
    frozen_plain = _linear(128, 384, 1536, plain, weight_grad=0.0)
    assert frozen[1] - frozen_plain[1] == pytest.approx(cold_weight_s(384, 1536, cpu))


def test_a_cpu_linear_forward_copies_its_weight_and_its_backward_does_not() -> None:
    """Source: F.linear timed alone (warm) on this project's CPU VM (one thread, fp32, 2026-11-27, with the copy
    curve timed the same minute: 77, 96, 27, 27, 6 and 5 GB/s for 0.25 to 128 MiB moved; the 2048^3 product at
    180.3 GFLOP/s), the forward at 32 and 128 rows of four weights. With one copy of the weight the model's mean
    error over them is within 12% (it is 24% from the FLOPs alone); the backward's GEMMs ran at full pace and are
    charged no copy. In a model each of the three GEMMs also reads or writes the cold weight once
    (cold_weight_s), which a GEMM timed alone does not; a GPU's linear is unchanged."""
    moved = (0.25, 1.0, 4.0, 16.0, 64.0, 128.0)
    rates = (77e9, 96e9, 27e9, 27e9, 6e9, 5e9)
    gain = tuple((mib * 2**20, rate / rates[-1]) for mib, rate in zip(moved, rates))
    cpu = replace(device_rates(load_hardware("cpu"), "fp32", Efficiency(memory_cache_gain=gain)),
                  matmul_flops_per_s=180.3e9, memory_bytes_per_s=5e9)
    plain = replace(cpu, packs_weights=False)
    measured_us = {(384, 384): (63, 204), (768, 768): (308, 994), (1024, 1024): (735, 1873), (512, 2048): (659, 1724)}
    errors, unpacked_errors = [], []
    for (n_in, n_out), times in measured_us.items():
        for rows, measured in zip((32, 128), times):
            forward, backward, _ = _linear(rows, n_in, n_out, cpu)
            cold = cold_weight_s(n_in, n_out, cpu)
            errors.append(abs((forward - cold) * 1e6 / measured - 1))
            unpacked_errors.append(abs(_linear(rows, n_in, n_out, plain)[0] * 1e6 / measured - 1))
            assert backward == pytest.approx(_linear(rows, n_in, n_out, plain)[1] + 2 * cold)
            assert cold > 0 and cold_weight_s(n_in, n_out, plain) == 0
    assert np.mean(errors) <= 0.12 and np.mean(unpacked_errors) >= 0.2
    assert cpu.packs_weights and not device_rates(load_hardware("h200"), "bf16", Efficiency()).packs_weights


def _eager_bytes(torch: object, fn: object, x: object) -> tuple[float, float]:
    """(forward, backward) bytes the non-GEMM, non-attention-kernel aten ops of fn(x) read and write, counted under
    a TorchDispatchMode (views, allocations and dtype casts move nothing and are left out)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    compute = {"mm", "addmm", "bmm", "_scaled_dot_product_flash_attention_for_cpu",
               "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_attention_math"}
    moved = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "select",
             "slice", "as_strided", "_reshape_alias", "alias", "split", "unbind", "split_with_sizes", "detach",
             "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "_to_copy"}

    class Count(TorchDispatchMode):
        total = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            if func.__name__.split(".")[0] not in compute | moved:
                tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
                self.total += sum(t.numel() * t.element_size() for t in tensors if t.numel() > 1000)
            return out

    forward, backward = Count(), Count()
    with forward:
        y = fn(x)
    with backward:
        y.backward(torch.ones_like(y))
    return forward.total, backward.total


@pytest.mark.parametrize("layout", ["batch_first", "sequence_first"])
def test_multihead_attention_layout_traffic_is_what_torch_runs(layout: str) -> None:
    # torch.nn.MultiheadAttention (nn.TransformerEncoderLayer's attention), batch-first or in its default (sequence,
    # batch, width) layout, against the split-projection attention the other models are costed as (Hugging Face
    # BERT's and Llama's layout: q, k, v, out linears on contiguous input, scaled_dot_product_attention): the bytes its
    # extra eager ops move, counted in the installed torch, are ops.MHA_RW_ELEMS's (within 10%, in units of one
    # element of the hidden state per token). Each attention gets its own input: a second backward into one input
    # would add the accumulation of its gradient.
    torch = pytest.importorskip("torch")
    from torch import nn
    n, s, e, h = 4, 64, 128, 4
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(e, h, dropout=0.0, batch_first=layout == "batch_first")
    q, k, v, o = (nn.Linear(e, e) for _ in range(4))

    def split(x):  # type: ignore[no-untyped-def]
        def heads(t):  # type: ignore[no-untyped-def]
            return t.view(n, s, h, e // h).transpose(1, 2)
        out = torch.nn.functional.scaled_dot_product_attention(heads(q(x)), heads(k(x)), heads(v(x)))
        return o(out.transpose(1, 2).reshape(n, s, e))

    unit = n * s * e * 4  # one fp32 element of the hidden state per token
    shape = (n, s, e) if layout == "batch_first" else (s, n, e)
    mha_f, mha_b = _eager_bytes(torch, lambda t: mha(t, t, t, need_weights=False)[0],
                                torch.randn(*shape, requires_grad=True))
    split_f, split_b = _eager_bytes(torch, split, torch.randn(n, s, e, requires_grad=True))
    (r_f, w_f, _), (r_b, w_b, _) = MHA_RW_ELEMS[layout]
    assert (mha_f - split_f) / unit == pytest.approx(r_f + w_f, rel=0.1)
    assert (mha_b - split_b) / unit == pytest.approx(r_b + w_b, rel=0.1)


@pytest.mark.parametrize("layout", ["batch_first", "sequence_first"])
def test_multihead_attention_over_a_memory_layout_traffic_is_what_torch_runs(layout: str) -> None:
    # nn.TransformerDecoderLayer's second attention: queries from the block, keys and values one memory tensor (as
    # long here), against the split-projection cross-attention: ops.MHA_CROSS_RW_ELEMS, within 10%.
    torch = pytest.importorskip("torch")
    from torch import nn
    n, s, e, h = 4, 64, 128, 4
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(e, h, dropout=0.0, batch_first=layout == "batch_first")
    q, k, v, o = (nn.Linear(e, e) for _ in range(4))
    shape = (n, s, e) if layout == "batch_first" else (s, n, e)

    def split(x):  # type: ignore[no-untyped-def]
        def heads(t):  # type: ignore[no-untyped-def]
            return t.view(n, s, h, e // h).transpose(1, 2)
        memory = split.memory
        out = torch.nn.functional.scaled_dot_product_attention(heads(q(x)), heads(k(memory)), heads(v(memory)))
        return o(out.transpose(1, 2).reshape(n, s, e))

    def cross(x):  # type: ignore[no-untyped-def]
        return mha(x, cross.memory, cross.memory, need_weights=False)[0]

    unit = n * s * e * 4
    cross.memory = torch.randn(*shape, requires_grad=True)
    split.memory = torch.randn(n, s, e, requires_grad=True)
    mha_f, mha_b = _eager_bytes(torch, cross, torch.randn(*shape, requires_grad=True))
    split_f, split_b = _eager_bytes(torch, split, torch.randn(n, s, e, requires_grad=True))
    (r_f, w_f, _), (r_b, w_b, _) = MHA_CROSS_RW_ELEMS[layout]
    assert (mha_f - split_f) / unit == pytest.approx(r_f + w_f, rel=0.1)
    assert (mha_b - split_b) / unit == pytest.approx(r_b + w_b, rel=0.1)


def test_multihead_attention_costs_its_layout_copies() -> None:
    # The same block with nn.MultiheadAttention's layout costs its traffic on top, both ways, and nothing else.
    model = load_model("bert-base")
    rates = device_rates(load_hardware("cpu"), "fp32", Efficiency())
    elems, pace = 8 * 128 * model.hidden_size, 4 / rates.memory_bytes_per_s
    plain = layer_times(model, 8, 128, 1, rates)
    for layout, ((r_f, w_f, k_f), (r_b, w_b, k_b)) in MHA_RW_ELEMS.items():
        mha = layer_times(model.replace(torch_multihead_attention=layout), 8, 128, 1, rates)
        assert float(mha.forward_s - plain.forward_s) == pytest.approx(elems * (r_f + w_f) * pace, rel=1e-9)
        assert float(mha.backward_s - plain.backward_s) == pytest.approx(elems * (r_b + w_b) * pace, rel=1e-9)
        assert (mha.forward_kernels - plain.forward_kernels, mha.backward_kernels - plain.backward_kernels) == \
            (k_f, k_b)
        assert mha.forward_flops == plain.forward_flops


def test_multihead_attention_over_a_memory_costs_its_layout_copies_in_the_cross_attention_blocks() -> None:
    # Every block a decoder's (cross_attention_layers = num_layers): the self-attention's copies and the
    # cross-attention's on top of the same blocks built of split projections.
    model = load_model("bert-base")
    model = model.replace(cross_attention_layers=model.num_layers)
    rates = device_rates(load_hardware("cpu"), "fp32", Efficiency())
    elems, pace = 8 * 128 * model.hidden_size, 4 / rates.memory_bytes_per_s
    plain = layer_times(model, 8, 128, 1, rates)
    for layout in MHA_RW_ELEMS:
        (r_f, w_f, k_f), (r_b, w_b, k_b) = MHA_RW_ELEMS[layout]
        (x_rf, x_wf, x_kf), (x_rb, x_wb, x_kb) = MHA_CROSS_RW_ELEMS[layout]
        mha = layer_times(model.replace(torch_multihead_attention=layout), 8, 128, 1, rates)
        assert float(mha.forward_s - plain.forward_s) == pytest.approx(elems * (r_f + w_f + x_rf + x_wf) * pace,
                                                                       rel=1e-9)
        assert float(mha.backward_s - plain.backward_s) == pytest.approx(elems * (r_b + w_b + x_rb + x_wb) * pace,
                                                                         rel=1e-9)
        assert (mha.forward_kernels - plain.forward_kernels, mha.backward_kernels - plain.backward_kernels) == \
            (k_f + x_kf, k_b + x_kb)
