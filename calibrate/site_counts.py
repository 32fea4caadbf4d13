"""What the profiling run counts of the user's model as it trains: the bytes the first block (or the whole model)
keeps for backward in its first forward, and a model's forward FLOPs where it has no repeated block. Loaded from its
file by calibrate/profiling_site/sitecustomize.py inside the user's process; imports torch, never zerotune."""

from __future__ import annotations

from typing import Any

__all__ = ["count_saved", "count_flops", "rnn_flops", "outer_saved_tensor_hooks", "op_counter", "RNN_GATES"]


def outer_saved_tensor_hooks(torch: Any) -> bool:
    """Whether saved-tensor hooks are active already (torch.autograd.graph.saved_tensors_hooks: non-reentrant
    checkpointing's own, torch/utils/checkpoint.py _checkpoint_hook; activation offloading). A torch without the
    query (before 2.1) is taken to have them, so nothing is entered beneath someone else's."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return True
    try:
        return top(False) is not None
    except TypeError:  # an older signature without the ignore-is-tensor flag
        return top() is not None


def count_saved(module: Any, block: Any, state: dict[str, Any], scope: str) -> None:
    """Bytes `block` (the first block, or the whole module: scope 'block' or 'model') keeps for backward in its
    first forward with gradients: every tensor autograd saves (torch.autograd.graph.saved_tensors_hooks), each
    storage once, parameters (and views of them) left out."""
    import torch
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: set[int] = set()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        try:
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # tensor subclasses without a plain storage
            key, size = id(tensor), tensor.numel() * tensor.element_size()
        if key not in params and key not in seen:
            seen.add(key)
            state[f"{scope}_saved_bytes"] += size
        return tensor
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
    active: list[bool] = []

    def enter(*_: Any) -> None:
        if not active and state[f"{scope}_saved_calls"] == 0 and torch.is_grad_enabled():
            if outer_saved_tensor_hooks(torch):
                # non-reentrant torch.utils.checkpoint (or an activation offload) already packs what this forward
                # saves; hooks entered inside it would take its place, so the block would keep its activations
                # instead of being recomputed on this rank only, and under ZeRO-3 the ranks' gathers in backward
                # would go out of step. Nothing is counted: the activations stay the formula's.
                state[f"{scope}_saved_calls"] = 1
                return
            hooks.__enter__()
            active.append(True)

    def leave(*_: Any) -> None:
        if active:
            hooks.__exit__(None, None, None)
            active.clear()
            state[f"{scope}_saved_calls"] = 1
    block.register_forward_pre_hook(enter)
    block.register_forward_hook(leave)


RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
"""Gate GEMMs an nn.LSTM, nn.GRU or nn.RNN step runs on its input and on its hidden state (torch.nn.modules.rnn)."""


def rnn_flops(rnn: Any, args: tuple[Any, ...]) -> int:
    """A recurrent module's forward FLOPs by hand: each layer and direction multiplies every position's input and
    hidden state by its gates' weights (2 x gates x hidden x (input + hidden) a position)."""
    x = args[0] if args else None
    data = getattr(x, "data", x)  # a PackedSequence's positions are its data's rows
    if data is None or not hasattr(data, "shape") or data.dim() < 2:
        return 0
    positions = data.shape[0] if data.dim() == 2 else data.shape[0] * data.shape[1]
    gates = RNN_GATES.get(type(rnn).__name__, 1)
    directions = 2 if rnn.bidirectional else 1
    hidden = rnn.hidden_size
    total = 0
    for layer in range(rnn.num_layers):
        width = rnn.input_size if layer == 0 else hidden * directions
        total += directions * 2 * gates * hidden * (width + hidden) * positions
    return int(total)


def count_flops(module: Any, state: dict[str, Any]) -> None:
    """FLOPs of the module's first forward with gradients (torch.utils.flop_counter.FlopCounterMode: matmuls and
    convolutions by their shapes), with the batch it ran; the counter is left after that forward. A recurrent layer
    the counter saw nothing of (torch 2.13's CPU nn.LSTM runs one fused aten op that has no FLOP formula; its GRU
    decomposes into counted matmuls) is counted by hand (rnn_flops). The same forward's dispatched ATen ops are
    counted too (op_counter): each costs the host its dispatch, which is what a model of many small ops spends its
    time on (torch 2.13's CPU nn.GRU: about 9,800 ops a forward at any batch, where its fused nn.LSTM runs 20)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    ops = op_counter(torch)
    active: list[bool] = []
    uncounted: list[int] = []
    marks: dict[int, int] = {}  # a recurrent module's id -> what the counter held as it began

    def enter(_module: Any, args: tuple[Any, ...]) -> None:
        if not active and not state["model_forward_flops"] and torch.is_grad_enabled():
            counter.__enter__()
            ops.__enter__()
            active.append(True)

    def leave(*_: Any) -> None:
        if active:
            ops.__exit__(None, None, None)
            counter.__exit__(None, None, None)
            active.clear()
            state["model_forward_flops"] = int(counter.get_total_flops()) + sum(uncounted)
            state["model_forward_ops"] = ops.count
            for handle in handles:
                handle.remove()

    def rnn_enter(rnn: Any, args: tuple[Any, ...]) -> None:
        if active:
            marks[id(rnn)] = counter.get_total_flops()

    def rnn_leave(rnn: Any, args: tuple[Any, ...], _output: Any) -> None:
        before = marks.pop(id(rnn), None)
        if active and before is not None:
            counted, by_hand = counter.get_total_flops() - before, rnn_flops(rnn, args)
            if counted < by_hand / 2:  # the counter missed the layer
                uncounted.append(by_hand - counted)
    handles = [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    for rnn in (m for m in module.modules() if isinstance(m, torch.nn.RNNBase)):
        handles += [rnn.register_forward_pre_hook(rnn_enter), rnn.register_forward_hook(rnn_leave)]


def op_counter(torch: Any) -> Any:
    """A dispatch mode that counts the ATen ops run inside it (views and in-place ops included: each costs the host
    a dispatch), each passed on unchanged."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            self.count += 1
            return func(*args, **(kwargs or {}))
    return OpCounter()
