"""Links and collectives: the time of one data-parallel or tensor-parallel collective on the links its ring
crosses (NVLink inside a node, one NIC for each of the ring's ranks on a node across nodes), as NCCL's ring
moves it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from zerotune.predictor.dsconfig import DSConfig
from zerotune.predictor.job import Efficiency, Job

__all__ = ["CollectiveKind", "Phase", "Collective", "data_parallel_link", "intra_node_link", "ring_across_nodes",
           "collective_s"]

CollectiveKind = Literal["all_reduce", "reduce_scatter", "all_gather"]
Phase = Literal["forward", "backward", "forward_backward", "after_step", "after_backward"]


@dataclass(frozen=True)
class Collective:
    """One kind of data-parallel collective in one micro-step (or once per step), split into buckets."""

    kind: CollectiveKind
    bytes_per_rank: float
    num_buckets: int
    phase: Phase
    per_micro_step: bool


def data_parallel_link(job: Job, eff: Efficiency, cfg: DSConfig | None = None) -> tuple[float, float]:
    """(bus bandwidth B/s, mean latency s per ring step) of a data-parallel ring; without `cfg`, of one stream
    between two nodes (a pipeline stage's send to the next).

    NCCL runs a collective as several rings (channels) at once, each leaving a node through its own NIC
    (one per GPU on the nodes the catalog describes), so a ring that holds r ranks of each node crosses the
    network r times in parallel and its bus bandwidth is r NICs' (capped by the node's own links): two nodes
    of eight A100s with four 200 Gb/s NICs each are expected to reach 100 GB/s of all-reduce bus bandwidth
    and measured 86 (github NVIDIA/nccl-tests issue 175; issue 119: three such nodes, 85-96 GB/s). The catalog's
    inter_node_bandwidth is per GPU (a DGX A100's 8 x 200 Gb/s: 25 GB/s), so ZeRO data parallelism over whole
    nodes of eight gets eight times one NIC, where the link of a single ring (one GPU a node, as under 8-way
    tensor parallelism) gets one. A ring that fits in one node (tensor x data parallel within it; Megatron's
    rank order: tensor, then data, then pipeline) runs on the node's links alone."""
    cluster = job.cluster
    if cluster.num_nodes == 1:
        return intra_node_link(job, eff)
    if cfg is None:
        return _one_nic(job, eff)
    tp, dp = cfg.mp_size, cfg.dp_size(cluster.world_size)
    if tp * dp <= cluster.num_gpus_per_node:
        return intra_node_link(job, eff)
    return ring_across_nodes(job, eff, dp, max(1, min(dp, cluster.num_gpus_per_node // tp)))


def ring_across_nodes(job: Job, eff: Efficiency, ranks: int, per_node: int) -> tuple[float, float]:
    """(bus bandwidth, mean latency per step) of a ring of `ranks` ranks, `per_node` of them on each node: one
    NIC for each of a node's ranks (data_parallel_link), capped by the node's links; NCCL's ring latency, the steps
    that cross a node boundary at the network's latency and the rest at the node's (src/graph/tuning.cc
    ncclTopoTuneModel: (nsteps - nInterSteps) x intraLat + nInterSteps x interLat, nInterSteps nNodes - 1 for a
    gather or scatter, twice that for an all-reduce), as a mean per step."""
    per_nic, latency = _one_nic(job, eff)
    if ranks <= 1:  # no ring (one data-parallel rank): nothing crosses, the figures are never used
        return per_nic, latency
    nvlink, hop = intra_node_link(job, eff)
    nodes = -(-ranks // per_node)
    return min(per_nic * per_node, nvlink), ((ranks - nodes) * hop + (nodes - 1) * latency) / (ranks - 1)


def _one_nic(job: Job, eff: Efficiency) -> tuple[float, float]:
    """(bandwidth B/s, latency s) of one stream over one GPU's NIC to another node."""
    hw = job.cluster.hardware
    latency = hw.inter_node_latency_s if eff.inter_node_latency_s is None else eff.inter_node_latency_s
    return hw.inter_node_bandwidth_bytes_per_s * eff.inter_node_bandwidth_efficiency, latency


def intra_node_link(job: Job, eff: Efficiency) -> tuple[float, float]:
    """(bandwidth B/s, latency s) of a ring within one node (tensor parallelism, single-node jobs)."""
    hw = job.cluster.hardware
    latency = hw.intra_node_latency_s if eff.intra_node_latency_s is None else eff.intra_node_latency_s
    return hw.intra_node_bandwidth_bytes_per_s * eff.intra_node_bandwidth_efficiency, latency


def collective_s(c: Collective, num_ranks: int, bandwidth: float, latency: float, eff: Efficiency | None = None
                 ) -> float:
    """Ring time of a collective: its bus volume at the link's bandwidth (times the operation's bandwidth ratio
    to an all-reduce, Efficiency.all_gather_bandwidth_ratio / reduce_scatter_bandwidth_ratio, when `eff` is
    given), plus a latency per ring step per call."""
    if num_ranks == 1:
        return 0.0
    steps = 2 * (num_ranks - 1) if c.kind == "all_reduce" else num_ranks - 1
    volume = c.bytes_per_rank * steps / num_ranks
    if eff is not None and c.kind != "all_reduce":
        bandwidth *= eff.all_gather_bandwidth_ratio if c.kind == "all_gather" else eff.reduce_scatter_bandwidth_ratio
    return volume / bandwidth + c.num_buckets * steps * latency
