"""A one-micro-step simulation: per-layer compute and bucketed collectives on two streams.

The closed form in step_time.py hides communication behind a compute window in bulk. This builds the
dependency graph it abstracts (networkx): the operator model's tasks (ops.py via step_time.stage_parts:
each block's forward, recompute + backward, and the embedding / logits / loss outside the blocks) on a
compute stream, gradient buckets that fill as blocks finish backward and are reduced on a communication
stream, and for ZeRO-3 the per-block parameter all-gathers that prefetch ahead of the compute that needs
them. Each stream runs its tasks in issue order, a task starts when its stream is free and its inputs are
done (list scheduling), and the exposed communication is the makespan minus the compute. Hardware that
cannot communicate beside compute (HardwareSpec.comm_compute_overlap false, e.g. DeepSpeed's CPU accelerator)
has one timeline: the collectives run in line with the compute, and all of them are exposed.

A single prediction (estimate) takes its in-step exposed communication from this schedule
(simulated_time); ranking a whole space uses the closed form, which tests/test_simulate.py holds to the
simulation within a stated tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from zerotune.predictor.dsconfig import DSConfig
from zerotune.predictor.job import Efficiency, Job
from zerotune.predictor.memory import DTYPE_BYTES
from zerotune.predictor.links import CollectiveKind
from zerotune.predictor.step_time import (Collective, TimeEstimate, collective_s, data_parallel_collectives,
                                          data_parallel_link, estimate_time, last_micro_step_exposed, StageParts,
                                          stage_parts)
from zerotune.predictor.zero_mechanics import fsdp_units, grad_reduction, zero3_trace

__all__ = ["SimulatedMicroStep", "simulate_micro_step", "simulated_time"]


@dataclass(frozen=True)
class SimulatedMicroStep:
    makespan_s: float
    compute_s: float
    comm_s: float

    @property
    def exposed_comm_s(self) -> float:
        return self.makespan_s - self.compute_s


def _add(graph: nx.DiGraph, name: str, stream: str, duration: float, after: list[str]) -> str:
    graph.add_node(name, stream=stream, duration=duration, order=graph.number_of_nodes())
    graph.add_edges_from((dep, name) for dep in after if dep)
    return name


def _schedule(graph: nx.DiGraph) -> float:
    """List scheduling: each stream runs its tasks in issue order."""
    free: dict[str, float] = {}
    finish: dict[str, float] = {}
    for node in nx.lexicographical_topological_sort(graph, key=lambda n: graph.nodes[n]["order"]):
        attrs = graph.nodes[node]
        start = max([free.get(attrs["stream"], 0.0)] + [finish[p] for p in graph.predecessors(node)])
        finish[node] = start + attrs["duration"]
        free[attrs["stream"]] = finish[node]
    return max(finish.values(), default=0.0)


def simulate_micro_step(job: Job, cfg: DSConfig, eff: Efficiency = Efficiency()) -> SimulatedMicroStep:
    """Simulate the last micro-step of a step (the one whose backward reduces, for every stage >= 1)."""
    parts = stage_parts(job, cfg, eff)
    if not job.cluster.hardware.comm_compute_overlap:
        return _in_line_micro_step(job, cfg, eff, parts)
    m, z = job.model, cfg.zero
    n_dp = cfg.dp_size(job.cluster.world_size)
    bandwidth, latency = data_parallel_link(job, eff, cfg)
    num_layers = parts.layers
    # Blocks that share weights (ModelSpec.distinct_layers) gather a held block's worth over its passes, and their
    # gradients are ready only after the last pass backward reaches, so they reduce after the blocks' backward.
    held_share = m.held_layers / m.num_layers
    layer_params = m.num_layer_params / cfg.mp_size * held_share
    # gathered: every parameter; reduced: the trainable ones (ModelSpec.frozen_layer_params), adapters in the blocks
    trained_layer_params = (m.num_trained_layer_params + m.adapter_params / m.held_layers) / cfg.mp_size
    shared_params = trained_layer_params * m.held_layers if m.distinct_layers else 0.0
    trained_layer_params = 0.0 if m.distinct_layers else trained_layer_params
    trained_outer_params = m.num_trained_outer_params / cfg.mp_size
    p, g = DTYPE_BYTES[cfg.precision], DTYPE_BYTES[cfg.grad_precision]
    reduce_kind = grad_reduction(m, cfg).kind  # stages 1-2 all-reduce their buckets (zero_mechanics)
    trace = zero3_trace(m, cfg)
    # ZeRO-3 issues one gather per module: a block's calls, and backward re-gathers only what forward released.
    units = fsdp_units(m, cfg, eff)
    layer_calls = max(1, round(trace.num_gather_calls_forward / m.num_layers)) if units is None else 1
    regather = trace.fetched_elems_backward / max(trace.fetched_elems_forward, 1.0)

    def comm(kind: CollectiveKind, elems: float, num_calls: int = 1) -> float:
        size = elems * (p if kind == "all_gather" else g)
        return collective_s(Collective(kind, size, num_calls, "backward", True), n_dp, bandwidth, latency, eff)

    graph = nx.DiGraph()
    gather_prev = compute_prev = ""
    prefetch_depth = max(1, int(z.stage3_prefetch_bucket_size_elems // max(layer_params, 1)))
    layer_fwd, layer_bwd = parts.block_forward_s, parts.block_backward_s + parts.block_recompute_s
    fwd_tasks: list[str] = []
    for i in range(num_layers):  # forward
        deps = [compute_prev]
        if z.stage == 3:
            # Prefetch keeps up to prefetch_depth blocks in flight ahead of the one computing.
            window = fwd_tasks[i - prefetch_depth - 1] if i > prefetch_depth else ""
            gather_prev = _add(graph, f"ag_f{i}", "comm", comm("all_gather", layer_params, layer_calls),
                               [gather_prev, window])
            deps.append(gather_prev)
        compute_prev = _add(graph, f"f{i}", "compute", layer_fwd, deps)
        fwd_tasks.append(compute_prev)
    # logits and loss (and, in one stage, the embedding) after the blocks; their backward first
    compute_prev = _add(graph, "outer_f", "compute", parts.outer_forward_s, [compute_prev])
    compute_prev = _add(graph, "outer_b", "compute", parts.outer_backward_s, [compute_prev])
    bucket_elems, reduce_prev, bwd_tasks = 0.0, "", []
    regathers: dict[int, str] = {}

    def regather_block(i: int) -> None:
        """Backward's gather of block i, issued when block i + prefetch_depth + 1's backward ends."""
        nonlocal gather_prev
        k = num_layers - 1 - i
        window = bwd_tasks[k - prefetch_depth - 1] if k > prefetch_depth else ""
        gather_prev = _add(graph, f"ag_b{i}", "comm", comm("all_gather", regather * layer_params, layer_calls),
                           [gather_prev, window])
        regathers[i] = gather_prev

    if z.stage == 3:  # the first blocks' gathers, before any backward compute
        for i in range(num_layers - 1, max(num_layers - 2 - prefetch_depth, -1), -1):
            regather_block(i)
    for i in reversed(range(num_layers)):  # backward, gradients bucketed as blocks finish
        deps = [compute_prev] + ([regathers[i]] if z.stage == 3 else [])
        compute_prev = _add(graph, f"b{i}", "compute", layer_bwd, deps)
        bwd_tasks.append(compute_prev)
        if z.stage == 3 and i - prefetch_depth - 1 >= 0:
            # the prefetch of a later block is issued in this block's backward, before its gradients' reduction
            # (partitioned_param_coordinator.py fetch_sub_module prefetches from the pre-backward hook), so the
            # link carries it ahead of this block's reduce-scatter
            regather_block(i - prefetch_depth - 1)
        bucket_elems += trained_layer_params
        if z.stage >= 1 and z.overlap_comm and (bucket_elems >= z.reduce_bucket_size_elems or units is not None):
            reduce_prev = _add(graph, f"rs{i}", "comm", comm(reduce_kind, bucket_elems),
                               [compute_prev, reduce_prev])
            bucket_elems = 0.0
    if z.stage >= 1:  # the last bucket (embeddings, shared blocks and what is left) or, without overlap, everything:
        # still one call a bucket (reduce_independent_p_g_buckets_and_remove_grads)
        left = bucket_elems + shared_params + trained_outer_params
        calls = max(1, math.ceil(left / max(z.reduce_bucket_size_elems, 1)))
        _add(graph, "rs_last", "comm", comm(reduce_kind, left, calls), [compute_prev, reduce_prev])
    compute_s = num_layers * (layer_fwd + layer_bwd) + parts.outer_forward_s + parts.outer_backward_s
    comm_s = sum(d for _, d in graph.nodes(data="duration") if d is not None) - compute_s
    return SimulatedMicroStep(makespan_s=_schedule(graph), compute_s=compute_s, comm_s=comm_s)


def _in_line_micro_step(job: Job, cfg: DSConfig, eff: Efficiency, parts: StageParts) -> SimulatedMicroStep:
    """The micro-step on hardware that cannot communicate beside compute (HardwareSpec.comm_compute_overlap
    false; step_time._in_step_exposed cites DeepSpeed's CPU accelerator, which has no streams): one timeline,
    the forward gathers before the blocks that use them, the backward gathers and gradient reductions in
    backward. Each collective is step_time's own (data_parallel_collectives, collective_s), so the schedule
    and the closed form count the same communication; with one stream none of it hides."""
    n_dp = cfg.dp_size(job.cluster.world_size)
    bandwidth, latency = data_parallel_link(job, eff, cfg)
    timed = [(c, collective_s(c, n_dp, bandwidth, latency, eff)) for c in data_parallel_collectives(job, cfg, eff)]
    layer_fwd, layer_bwd = parts.block_forward_s, parts.block_backward_s + parts.block_recompute_s
    graph, prev = nx.DiGraph(), ""
    tasks = ([(f"{c.kind}_f{i}", t) for i, (c, t) in enumerate(timed) if c.phase == "forward"]
             + [(f"f{i}", layer_fwd) for i in range(parts.layers)]
             + [("outer_f", parts.outer_forward_s), ("outer_b", parts.outer_backward_s)]
             + [(f"b{i}", layer_bwd) for i in reversed(range(parts.layers))]
             + [(f"{c.kind}_b{i}", t) for i, (c, t) in enumerate(timed) if c.phase == "backward"])
    for name, duration in tasks:
        prev = _add(graph, name, "compute", duration, [prev])
    compute_s = parts.layers * (layer_fwd + layer_bwd) + parts.outer_forward_s + parts.outer_backward_s
    comm_s = sum(t for c, t in timed if c.phase in ("forward", "backward"))
    return SimulatedMicroStep(makespan_s=_schedule(graph), compute_s=compute_s, comm_s=comm_s)


def simulated_time(job: Job, cfg: DSConfig, eff: Efficiency = Efficiency()) -> TimeEstimate:
    """estimate_time with the communication exposed inside micro-steps taken from the simulated schedule
    instead of the closed form: what a single prediction reports. Micro-steps that reduce (the last one;
    every one for ZeRO-2 and -3) each expose what the simulation of the last one does."""
    closed = estimate_time(job, cfg, eff)
    repeats = cfg.gradient_accumulation_steps if cfg.zero.stage >= 2 else 1
    simulated = simulate_micro_step(job, cfg, eff).exposed_comm_s
    exposed = closed.breakdown_s["exposed_comm"] + repeats * (simulated - last_micro_step_exposed(job, cfg, eff))
    return TimeEstimate(breakdown_s={**closed.breakdown_s, "exposed_comm": max(exposed, 0.0)},
                        comm_total_s=closed.comm_total_s, model_flops_per_gpu=closed.model_flops_per_gpu)
