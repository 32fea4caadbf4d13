"""DeepSpeed's engine timers as a run prints them: the global timer lines rank 0 prints at every optimizer step with
wall_clock_breakdown on (fwd, bwd, bwd_inner, bwd_allreduce, step; ZeRO's optimizer_step), else the throughput lines,
read back into seconds per optimizer step."""

from __future__ import annotations

import re

__all__ = ["step_times_s", "allreduce_times_s", "backward_inner_times_s", "forward_times_s", "step_phase_times_s"]

_TIMER_LINE = re.compile(r"time \(ms\) \| fwd: ([0-9.]+) \| bwd: ([0-9.]+) \|.*?\| step: ([0-9.]+)")
"""The engine's global timers, printed by rank 0 at every optimizer step when wall_clock_breakdown is on
(runtime/engine.py step -> timers.log(global_timers), utils/timer.py SynchronizedWallClockTimer.log, printed
whatever the log level): forward, backward and optimizer milliseconds summed over the step's micro-steps, the
same timers the engine's autotuning latency is computed from (runtime/engine.py _autotuning_exit)."""
_THROUGHPUT_LINE = re.compile(r"global_step=(\d+), RunningAvgSamplesPerSec=[^,]*, CurrSamplesPerSec=([0-9.eE+-]+)")
"""The engine's ThroughputTimer line (utils/timer.py ThroughputTimer.stop), logged every steps_per_print steps
when the log level is info: CurrSamplesPerSec is train_batch_size over the step's elapsed time."""


def step_times_s(stdout: str, train_batch_size: int) -> tuple[float, ...]:
    """Seconds per optimizer step, in order, from the engine's global timer lines (_TIMER_LINE), else from its
    throughput lines (_THROUGHPUT_LINE)."""
    timers = [sum(float(g) for g in m.groups()) / 1e3 for m in _TIMER_LINE.finditer(stdout)]
    if timers:
        return tuple(timers)
    times: dict[int, float] = {}
    for match in _THROUGHPUT_LINE.finditer(stdout):
        rate = float(match.group(2))
        if rate > 0:
            times[int(match.group(1))] = train_batch_size / rate
    return tuple(times[step] for step in sorted(times))


_UPDATE_LINE = re.compile(r"time \(ms\) \|[^\n]*?optimizer_step: ([0-9.]+)")
"""ZeRO 1-3's optimizer timers line (runtime/zero/stage_1_and_2.py and stage3.py: OPTIMIZER_STEP_TIMER around the
wrapped optimizer's step, the update alone; beside it optimizer_gradients and optimizer_allgather), printed by rank 0
at every optimizer step with wall_clock_breakdown on."""


_ALLREDUCE_LINE = re.compile(r"time \(ms\) \|[^\n]*?\| bwd_allreduce: ([0-9.]+)")
"""The engine's gradient-reduction timer in the same global timer lines (runtime/engine.py _backward_epilogue
starts it after the backward's own work and stops it after allreduce_gradients; utils/timer.py 'bwd_allreduce')."""


def allreduce_times_s(stdout: str) -> tuple[float, ...]:
    """The engine's bwd_allreduce timer, seconds per optimizer step, in order, as printed."""
    return tuple(float(m.group(1)) / 1e3 for m in _ALLREDUCE_LINE.finditer(stdout))


_BWD_INNER_LINE = re.compile(r"time \(ms\) \|[^\n]*?\| bwd_inner: ([0-9.]+)")
"""The engine's backward less its gradient reduction, in the same global timer lines (runtime/engine.py backward:
BACKWARD_INNER_GLOBAL_TIMER around the loss's backward, before _backward_epilogue's bwd_allreduce)."""


def backward_inner_times_s(stdout: str) -> tuple[float, ...]:
    """The engine's bwd_inner timer, seconds per optimizer step (its micro-steps summed), in order, as printed."""
    return tuple(float(m.group(1)) / 1e3 for m in _BWD_INNER_LINE.finditer(stdout))


def forward_times_s(stdout: str) -> tuple[float, ...]:
    """The engine's fwd timer, seconds per optimizer step (its micro-steps' forwards summed), in order, as printed."""
    return tuple(float(m.group(1)) / 1e3 for m in _TIMER_LINE.finditer(stdout))


def step_phase_times_s(stdout: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(the engine's step timer, ZeRO's optimizer_step timer) seconds per optimizer step, in order, as printed;
    the second is empty for ZeRO-0, whose engine times the optimizer's step only as a whole."""
    steps = tuple(float(m.group(3)) / 1e3 for m in _TIMER_LINE.finditer(stdout))
    return steps, tuple(float(m.group(1)) / 1e3 for m in _UPDATE_LINE.finditer(stdout))
