"""The step-time model: FLOP counts from the literature, DeepSpeed's communication schedule per stage."""

from __future__ import annotations

import math

import pytest

from zerotune.predictor import DSConfig, Efficiency, ZeroConfig, estimate, estimate_time
from zerotune.predictor.dsconfig import ActivationCheckpointing
from zerotune.predictor.flops import micro_batch_flops
from zerotune.predictor.model import ModelSpec
from zerotune.predictor.step_time import TIME_TERMS, data_parallel_collectives
from zerotune.predictor.zero_mechanics import zero3_trace
from tests.conftest import make_job

EFF = Efficiency()


def fp16(stage: int, **kw) -> DSConfig:
    zero = {k: v for k, v in kw.items() if k in ZeroConfig.__dataclass_fields__}
    rest = {k: v for k, v in kw.items() if k not in zero}
    return DSConfig(precision="fp16", zero=ZeroConfig(stage=stage, **zero), **rest)


def test_flops_match_megatron_formula() -> None:
    # Narayanan et al. 2021 eq. (sec. 5.1): 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per step with recompute.
    m = ModelSpec("gpt-18b", 40, 6144, 48, 48, 4 * 6144, 51200, 2048)
    b, s, l, h, v = 8, 2048, 40, 6144, 51200
    flops = micro_batch_flops(m, b, s, recompute=True).total_flops
    assert flops == pytest.approx(96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)), rel=1e-12)


def test_breakdown_sums_to_step_time() -> None:
    job = make_job("gpt2-xl", "a100-80gb", 2, 8)
    for stage in range(4):
        t = estimate_time(job, fp16(stage, gradient_accumulation_steps=2))
        assert set(t.breakdown_s) == set(TIME_TERMS)
        assert sum(t.breakdown_s.values()) == pytest.approx(t.step_s, rel=1e-12)


def test_stage0_all_reduce_is_a_ring() -> None:
    # Ring all-reduce: each rank sends and receives 2(N-1)/N of the gradient bytes (Thakur et al. 2005).
    job = make_job("gpt2-large", "a100-80gb", 1, 8)
    hw, psi = job.cluster.hardware, job.model.num_params
    t = estimate_time(job, fp16(0))
    bw = hw.intra_node_bandwidth_bytes_per_s * EFF.intra_node_bandwidth_efficiency
    buckets = math.ceil(psi / 5e8)  # DeepSpeed engine.allreduce_gradients: 5e8-element buckets
    expected = 2 * 7 / 8 * 2 * psi / bw + buckets * 2 * 7 * hw.intra_node_latency_s
    assert t.comm_total_s == pytest.approx(expected, rel=1e-9)
    assert t.breakdown_s["exposed_comm"] == pytest.approx(expected, rel=1e-9)  # after backward: not hidden


def _ring_volume(job, cfg) -> float:
    """Bytes per rank over the ring of every data-parallel collective in one step (gas 1)."""
    n = cfg.dp_size(job.cluster.world_size)
    return sum(c.bytes_per_rank * (2 if c.kind == "all_reduce" else 1) * (n - 1) / n
               for c in data_parallel_collectives(job, cfg))


def test_stage2_moves_what_deepspeed_0_19_issues_not_the_papers_two_psi() -> None:
    # ZeRO paper sec. 7.2 assumes reduce-scatter: P_os+g moves 2 Psi per step, P_os+g+p 3 Psi (1.5x). DeepSpeed
    # 0.19 averages each stage-1/2 bucket with an all-reduce even with reduce_scatter: true
    # (use_multi_rank_bucket_allreduce defaults to true, zero/config.py:119; stage_1_and_2.py:1695-1712), so
    # stage 2 moves 2 Psi + Psi (all-gather of the partitions) = 3 Psi. Stage 3 gathers the non-persistent
    # parameters in forward, again in backward those forward released (stage3_max_reuse_distance), and
    # reduce-scatters Psi (stage3.py:1912-1946).
    job = make_job("llama-2-7b", "a100-80gb", 4, 8)
    psi_bytes = job.model.num_params * 2
    n = job.cluster.world_size
    assert _ring_volume(job, fp16(2)) == pytest.approx(3 * psi_bytes * (n - 1) / n, rel=1e-9)
    trace = zero3_trace(job.model, fp16(3))
    gathered = trace.fetched_elems_forward + trace.fetched_elems_backward
    # Llama-2-7B is 13x the default 1e9-element reuse distance: all but the last ~5e8 elements are gathered twice.
    assert gathered == pytest.approx(2 * job.model.num_params - 5e8, rel=0.02)
    assert _ring_volume(job, fp16(3)) == pytest.approx((2 * gathered + psi_bytes) * (n - 1) / n, rel=1e-9)


def test_gradient_accumulation_repeats_stage2_reduction_only() -> None:
    # Stage 2 reduces in every micro-step's backward; stages 0 and 1 reduce once per step.
    job = make_job("gpt2-xl", "a100-80gb", 2, 8)
    for stage, grows in ((0, False), (1, False), (2, True), (3, True)):
        one, four = (estimate_time(job, fp16(stage, gradient_accumulation_steps=g)).comm_total_s for g in (1, 4))
        assert (four > one * 1.5) is grows, stage
    reduce = [c for c in data_parallel_collectives(job, fp16(2)) if c.kind == "all_reduce"]
    assert reduce and reduce[0].per_micro_step


def test_overlap_comm_hides_communication_but_not_the_last_bucket() -> None:
    job = make_job("gpt2-xl", "a100-80gb", 2, 8)
    plain = estimate_time(job, fp16(2, overlap_comm=False))
    overlapped = estimate_time(job, fp16(2, overlap_comm=True))
    assert overlapped.breakdown_s["exposed_comm"] < plain.breakdown_s["exposed_comm"]
    assert overlapped.breakdown_s["exposed_comm"] > 0  # the all-gather after the step and the last bucket


def test_metrics_follow_deepspeeds_definitions() -> None:
    job = make_job("gpt2-large", "v100-32gb", 1, 16)
    est = estimate(job, fp16(1, train_micro_batch_size_per_gpu=3, gradient_accumulation_steps=2))
    assert est.samples_per_step == 3 * 2 * 16  # train_batch_size
    assert est.throughput_samples_per_s == pytest.approx(96 / est.time.step_s)
    assert est.latency_ms == pytest.approx(est.time.step_s * 1e3)
    flops = micro_batch_flops(job.model, 3, job.seq_len, recompute=False).model_flops * 2
    assert est.flops_per_gpu == pytest.approx(flops / est.time.step_s)
    assert 0 < est.mfu < Efficiency().gemm_efficiency_scale


def test_recompute_costs_one_more_forward() -> None:
    job = make_job("gpt2-large", "a100-80gb", 1, 8)
    plain = estimate_time(job, fp16(1))
    ckpt = estimate_time(job, fp16(1, activation_checkpointing=ActivationCheckpointing(True)))
    logits_share = plain.breakdown_s["forward"] - ckpt.breakdown_s["recompute"]
    assert 0 < logits_share < 0.25 * plain.breakdown_s["forward"]  # the logits are not recomputed


def test_pipeline_bubble_and_stage_share():
    """1F1B pipeline (Narayanan et al. 2021, sec. 2.2): each stage computes 1/pp of the blocks per micro-batch, the
    busiest (last, with the logits) paces the steady state and the fill and drain pass through the others."""
    from zerotune.predictor import DSConfig, estimate_time
    from zerotune.predictor.dsconfig import ZeroConfig
    from tests.conftest import make_job
    job = make_job("gpt2-xl", "a100-80gb", 1, 8, 1024)
    flat = DSConfig(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=8, precision="bf16",
                    zero=ZeroConfig(stage=1))
    piped = flat.replace(pp_size=4)
    device_bound = Efficiency(kernel_launch_s=1e-9)  # the stage share of device time, not of host launches
    t_flat, t_pipe = estimate_time(job, flat, device_bound).breakdown_s, estimate_time(job, piped, device_bound).breakdown_s
    # the busiest (last) stage runs a quarter of the blocks and the whole logits and loss
    headless = estimate_time(job.__class__(job.model.replace(head="none"), job.cluster, job.seq_len), flat, device_bound)
    logits_s = t_flat["forward"] - headless.breakdown_s["forward"]
    assert t_flat["forward"] / 4 < t_pipe["forward"] < t_flat["forward"] / 4 + logits_s
    # the fill and drain pass once through each of the other three stages, which run blocks only
    per_micro = (t_pipe["forward"] + t_pipe["backward"] + t_pipe["recompute"]) / 8
    blocks_only = estimate_time(job.__class__(job.model.replace(head="none", final_norm=False), job.cluster,
                                              job.seq_len), piped, device_bound).breakdown_s
    inner = (blocks_only["forward"] + blocks_only["backward"] + blocks_only["recompute"]) / 8
    assert t_pipe["pipeline_bubble"] == pytest.approx(3 * inner, rel=1e-9)
    assert t_pipe["pipeline_bubble"] < 3 * per_micro  # the busiest stage's logits and loss idle no one
    assert t_flat["pipeline_bubble"] == 0.0


@pytest.mark.parametrize("tp,measured_ms", [(2, 11.4), (4, 17.7), (8, 35.0)])
def test_tensor_parallel_cost_matches_vtrain_at_equal_work_per_gpu(tp: int, measured_ms: float) -> None:
    # vTrain's fit half (data/measurements/published/vtrain_single.jsonl, GPT-h2048-L12, A100, full recompute):
    # with micro-batch = tp every GPU runs the same GEMMs as tp 1 at micro-batch 1, and the slope of step time
    # over accumulation steps (ms per micro-step) grew by 11.4, 17.7 and 35.0 ms at tp 2, 4 and 8. Megatron's
    # all-reduces (6 per block, + embedding and loss) account for it within 25%.
    from zerotune.predictor.catalog import load_hardware
    from zerotune.predictor.hardware import ClusterSpec
    from zerotune.predictor.job import Job
    model = ModelSpec(name="GPT-h2048-L12", num_layers=12, hidden_size=2048, num_heads=16, num_kv_heads=16,
                      ffn_hidden_size=8192, vocab_size=50257, max_position_embeddings=1024)
    job = Job(model, ClusterSpec(load_hardware("a100-80gb"), 1, 8), 1024)
    cfg = DSConfig(train_micro_batch_size_per_gpu=tp, gradient_accumulation_steps=4, precision="fp16", mp_size=tp,
                   activation_checkpointing=ActivationCheckpointing(enabled=True))
    per_micro_step = estimate_time(job, cfg).breakdown_s["tensor_parallel_comm"] / 4
    assert per_micro_step == pytest.approx(measured_ms * 1e-3, rel=0.25)


def _gpt_h1024_job(num_nodes: int = 1):
    from zerotune.predictor.catalog import load_hardware
    from zerotune.predictor.hardware import ClusterSpec
    from zerotune.predictor.job import Job
    # vTrain's Megatron-DeepSpeed GPT: Megatron pads the 50,257-token vocabulary (ModelSpec.vocab_padding_multiple)
    model = ModelSpec(name="GPT-h1024-L12", num_layers=12, hidden_size=1024, num_heads=16, num_kv_heads=16,
                      ffn_hidden_size=4096, vocab_size=50257, max_position_embeddings=1024, vocab_padding_multiple=128)
    return Job(model, ClusterSpec(load_hardware("a100-80gb"), num_nodes, 8), 1024)


def test_cross_entropy_all_reduces_are_timed_at_one_fp32_value_per_token() -> None:
    # Megatron's vocabulary-parallel cross-entropy all-reduces the logits' max, the target logit and the sum of
    # exponentials: 3 tensors of batch x seq fp32 values (megatron/core/tensor_parallel/cross_entropy.py), not
    # activations of batch x seq x hidden. Device-bound (no host floor), tp 2, micro-batch 4, seq 1024:
    # 2 x 12 + 1 (embedding) activation all-reduces forward, 2 x 12 + 1 backward, 2 x 12 recompute, each of
    # 4 x 1024 x 1024 x 2 B = 8.4 MB; and 3 of 4 x 1024 x 4 B = 16 KB.
    from zerotune.predictor.step_time import tensor_parallel_allreduce_s
    job = _gpt_h1024_job()
    cfg = DSConfig(train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=1, precision="fp16", mp_size=2,
                   activation_checkpointing=ActivationCheckpointing(enabled=True))
    eff = Efficiency(kernel_launch_s=1e-9)
    full = tensor_parallel_allreduce_s(job, cfg, eff, 4 * 1024 * 1024 * 2)
    small = tensor_parallel_allreduce_s(job, cfg, eff, 4 * 1024 * 4)
    got = estimate_time(job, cfg, eff).breakdown_s["tensor_parallel_comm"]
    assert got == pytest.approx((25 + 25 + 24) * full + 3 * small, rel=1e-9)
    # a 16 KB all-reduce costs its fixed 65 us, 2 ring steps of 8 us and Hockney's n_1/2 = 8 MB at 225 GB/s
    # (36 us): 117 us, against 211 us for an 8.4 MB activation
    assert small == pytest.approx(65e-6 + 2 * 8e-6 + (16384 + 8e6) / 225e9, rel=0.02)
    assert full == pytest.approx(65e-6 + 2 * 8e-6 + (8388608 + 8e6) / 225e9, rel=0.02)


@pytest.mark.parametrize("num_nodes,expected_ms", [(1, 1.436), (2, 9.997)])
def test_pipeline_p2p_transfers_per_micro_batch(num_nodes: int, expected_ms: float) -> None:
    # DeepSpeed's PipelineEngine sends each micro-batch's hidden states forward and their gradient back with
    # blocking p2p.send / p2p.recv (runtime/pipe/engine.py:1024-1216, runtime/pipe/p2p.py:46-84). pp 4, gas 8,
    # micro-batch 4 x seq 1024 x hidden 1024 x 2 B = 8.39 MB a transfer, 2 x (8 + 3) = 22 transfers on the
    # critical path. One node: NVLink 300 GB/s x 0.75 -> 37.3 us + 8 us latency + 20 us launch = 65.3 us,
    # 1.44 ms a step. Two nodes (a boundary crosses the network): 25 GB/s x 0.8 -> 419 us + 15 + 20 us = 454 us,
    # 9.99 ms. (DGX A100 figures of data/hardware/a100-80gb.yaml.)
    job = _gpt_h1024_job(num_nodes)
    cfg = DSConfig(train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=8, precision="fp16", pp_size=4,
                   activation_checkpointing=ActivationCheckpointing(enabled=True))
    assert estimate_time(job, cfg).breakdown_s["pipeline_p2p"] == pytest.approx(expected_ms * 1e-3, rel=0.01)
    assert estimate_time(job, cfg.replace(pp_size=1)).breakdown_s["pipeline_p2p"] == 0.0


def test_forward_tail_follows_host_bound_blocks() -> None:
    # Host-bound regime (GPT-h1024-L12 at micro-batch 1 on an A100, vTrain's smallest runs): the 12 blocks' forward
    # (with the embedding) is 5.1 ms of device work launched over 12.15 ms of host time (243 kernels at 50 us),
    # so the device idles; the final norm, logits GEMM and loss (0.81 ms of device time, 5 kernels) are launched
    # after the blocks and cannot use that idle time: forward = 12.15 + 0.81 = 12.96 ms, not the bulk
    # max(5.9, 12.4) = 12.4 ms.
    from zerotune.predictor.ops import device_rates, layer_times, outer_times
    from zerotune.predictor.step_time import compute_times
    job = _gpt_h1024_job()
    cfg = DSConfig(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, precision="fp16",
                   activation_checkpointing=ActivationCheckpointing(enabled=True))
    rates = device_rates(job.cluster.hardware, "fp16", EFF)
    block, outer = layer_times(job.model, 1, 1024, 1, rates), outer_times(job.model, 1, 1024, 1, rates, True)
    tail = outer_times(job.model, 1, 1024, 1, rates, False)
    blocks_dev = 12 * block.forward_s + outer.forward_s - tail.forward_s
    blocks_host = rates.kernel_launch_s * (12 * block.forward_kernels + outer.forward_kernels - tail.forward_kernels)
    assert blocks_host > blocks_dev  # host-bound
    forward = compute_times(job, cfg, EFF)[0]
    assert forward == pytest.approx(blocks_host + tail.forward_s, rel=1e-9)
    assert forward == pytest.approx(12.96e-3, rel=0.01)
    # device-bound (micro-batch 8): the host runs ahead, the phase is the device's sum as before
    big = compute_times(job, cfg.replace(train_micro_batch_size_per_gpu=8), EFF)[0]
    block8, outer8 = layer_times(job.model, 8, 1024, 1, rates), outer_times(job.model, 8, 1024, 1, rates, True)
    assert big == pytest.approx(12 * block8.forward_s + outer8.forward_s, rel=1e-9)


@pytest.mark.parametrize("layers,pp,first,last", [(78, 12, 7, 6), (70, 12, 6, 5), (78, 6, 13, 13), (20, 8, 3, 2)])
def test_pipeline_stages_follow_deepspeeds_type_transformer_partition(layers: int, pp: int, first: int,
                                                                      last: int) -> None:
    # deepspeed 0.19 runtime/utils.py:627 partition_balanced over GPTModelPipe's layers weighted 1 per block
    # ('type:transformer') gives 78 blocks on 12 stages as [7] * 6 + [6] * 6 and 20 on 8 as [3] * 4 + [2] * 4:
    # the extra blocks go to the first stages, so the last (logits and loss) has floor(L / pp).
    from zerotune.predictor.step_time import pipeline_stages
    model = ModelSpec(name="gpt", num_layers=layers, hidden_size=1024, num_heads=16, num_kv_heads=16,
                      ffn_hidden_size=4096, vocab_size=250880, max_position_embeddings=2048)
    (head_model, n_first, emb_first), (tail_model, n_last, emb_last) = pipeline_stages(model, pp)
    assert (n_first, emb_first, head_model.head) == (first, True, "none")
    assert (n_last, emb_last, tail_model.head) == (last, False, "lm")
    assert pipeline_stages(model, 1) == ((model, layers, True),)


def _overlap_flag(job, overlap: bool):
    import dataclasses
    hw = dataclasses.replace(job.cluster.hardware, comm_compute_overlap=overlap)
    return dataclasses.replace(job, cluster=dataclasses.replace(job.cluster, hardware=hw))


def test_hardware_without_overlap_exposes_all_of_a_zero3_steps_communication() -> None:
    # data/hardware/cpu.yaml comm_compute_overlap: false (DeepSpeed's CPU accelerator has no streams; gloo copies
    # and reduces on the compute cores). Every collective of a ZeRO-3 step then adds to it, overlap_comm and
    # prefetch notwithstanding: per micro-step a ring reduce-scatter of Psi*4 bytes and the forward and backward
    # all-gathers of the fetched parameters, each (N-1)/N of its bytes over the link plus (N-1) latencies per call
    # (Thakur et al. 2005), N = 2 ranks.
    job = make_job("zt-gpt-small", "cpu", 1, 2, 128)
    assert not job.cluster.hardware.comm_compute_overlap
    cfg = DSConfig(precision="fp32", train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2,
                   zero=ZeroConfig(stage=3, overlap_comm=True))
    hw, trace, psi = job.cluster.hardware, zero3_trace(job.model, cfg), job.model.num_params
    bw = hw.intra_node_bandwidth_bytes_per_s * EFF.intra_node_bandwidth_efficiency
    lat = hw.intra_node_latency_s if EFF.intra_node_latency_s is None else EFF.intra_node_latency_s
    reduce_calls = math.ceil(psi / cfg.zero.reduce_bucket_size_elems)
    per_micro = (psi * 4 / 2 / bw + reduce_calls * lat
                 + trace.fetched_elems_forward * 4 / 2 / bw + trace.num_gather_calls_forward * lat
                 + trace.fetched_elems_backward * 4 / 2 / bw + trace.num_gather_calls_backward * lat)
    closed, product = estimate_time(job, cfg), estimate(job, cfg).time  # closed form, simulated schedule
    for t in (closed, product):
        assert t.breakdown_s["exposed_comm"] == pytest.approx(2 * per_micro, rel=1e-9)
        assert t.breakdown_s["exposed_comm"] == pytest.approx(t.comm_total_s, rel=1e-9)
    # The same device with streams hides most of it behind compute (overlap_efficiency 0.9 of the window).
    hidden = estimate_time(_overlap_flag(job, True), cfg)
    assert hidden.breakdown_s["exposed_comm"] < 0.8 * hidden.comm_total_s


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_hardware_without_overlap_exposes_every_lower_stage_collective(stage: int) -> None:
    # ZeRO-1/2's reduction stream does not exist on the CPU accelerator (stage_1_and_2.py:599): with overlap_comm
    # on, the bucket all-reduces still block the backward hook, so exposed = all communication.
    job = make_job("zt-gpt-small", "cpu", 1, 2, 128)
    cfg = DSConfig(precision="fp32", train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=3,
                   zero=ZeroConfig(stage=stage, overlap_comm=stage > 0))
    t = estimate(job, cfg).time
    assert t.comm_total_s > 0
    assert t.breakdown_s["exposed_comm"] == pytest.approx(t.comm_total_s, rel=1e-9)


def test_unfused_adam_moves_80_bytes_a_parameter_where_a_fused_one_moves_28() -> None:
    # torch/optim/adam.py _single_tensor_adam's passes (zero_mechanics.UNFUSED_ADAM_BYTES_PER_PARAM) against one fused
    # pass (FUSED_ADAM_BYTES_PER_PARAM); fp32 without ZeRO has no wrapper traffic on top, so the ratio is exact.
    # Measured on this project's CPU: 4.0 ns a parameter per tensor against 1.33 fused (3.0x).
    job = make_job("gpt2", "a100-80gb", 1, 1, 512)
    fused, unfused = (estimate_time(job, DSConfig(optimizer_impl=impl), Efficiency()).breakdown_s["optimizer_step"]
                      for impl in ("fused", "torch"))
    assert unfused / fused == pytest.approx(80 / 28, rel=1e-9)


def test_an_operations_bandwidth_ratio_scales_only_its_own_volume() -> None:
    from zerotune.predictor.step_time import Collective, collective_s
    eff = Efficiency(all_gather_bandwidth_ratio=0.5, reduce_scatter_bandwidth_ratio=0.25)
    bw, lat = 1e9, 0.0
    gather = Collective("all_gather", 1e8, 1, "forward", True)
    reduce_ = Collective("all_reduce", 1e8, 1, "backward", True)
    scatter = Collective("reduce_scatter", 1e8, 1, "backward", True)
    # 2 ranks: an all-gather moves half its buffer, an all-reduce the whole (two ring steps of half)
    assert collective_s(gather, 2, bw, lat, eff) == pytest.approx(2 * collective_s(gather, 2, bw, lat))
    assert collective_s(scatter, 2, bw, lat, eff) == pytest.approx(4 * collective_s(scatter, 2, bw, lat))
    assert collective_s(reduce_, 2, bw, lat, eff) == pytest.approx(collective_s(reduce_, 2, bw, lat)) == 0.1


@pytest.mark.parametrize("hardware", ["cpu", "h100-80gb"])
def test_a_stand_ins_counted_ops_cost_the_host_their_dispatches(hardware: str) -> None:
    """A model described by a stand-in (validate/profiled.py _stand_in) dispatches the ops its profiling run counted
    (ModelSpec.dispatched_forward_ops), not the stand-in's few GEMMs: forward launches them, backward
    BACKWARD_OPS_PER_FORWARD times as many, at the device's launch cost each. On a CPU, which runs its kernels on the
    host's own thread, the launches beyond the stand-in's add to the kernels' time; on a GPU the host launches them
    while the device runs, so a phase takes the longer of the two."""
    from zerotune.predictor.ops import BACKWARD_OPS_PER_FORWARD
    from zerotune.predictor.catalog import load_hardware
    from zerotune.predictor.hardware import ClusterSpec
    from zerotune.predictor.job import Job
    from zerotune.predictor.step_time import _stage_op_times
    stand_in = ModelSpec(name="stand-in", num_layers=1, hidden_size=256, num_heads=1, num_kv_heads=1,
                         attention_head_dim=1, ffn_hidden_size=1024, vocab_size=0, max_position_embeddings=128,
                         position_embedding="none", tied_embeddings=False, dropout=False, attention="flash",
                         head="none", final_norm=False)
    hw = load_hardware(hardware)
    cfg = DSConfig(train_micro_batch_size_per_gpu=1, precision="fp32" if hardware == "cpu" else "bf16")
    eff = Efficiency()
    times = [_stage_op_times(Job(m, ClusterSpec(hw, 1, 2), 128), cfg, eff, 1)
             for m in (stand_in, stand_in.replace(dispatched_forward_ops=10_000))]
    (dev_f, dev_b, _, host_f, host_b, *_), (dev_f2, dev_b2, _, host_f2, host_b2, *_) = times
    launch = hw.kernel_launch_s
    assert host_f2 == pytest.approx(10_000 * launch) and host_b2 == pytest.approx(14_000 * launch)
    assert BACKWARD_OPS_PER_FORWARD == 1.4
    if hardware == "cpu":  # the dispatches beyond the stand-in's own follow its kernels on the one thread
        assert dev_f2 - dev_f == pytest.approx(host_f2 - host_f) and dev_b2 - dev_b == pytest.approx(host_b2 - host_b)
    else:
        assert (dev_f2, dev_b2) == (dev_f, dev_b)
