"""What the profiling run saw the model's forward take: the micro-batch and positions its blocks run over, read from
the first forward's inputs and the first block's input (<prefix>.rank<R>.json, calibrate/profiling_site), and the
lengths a padding collator gave each batch. Used by zerotune.validate.profiled; imports no torch."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["Tokens", "token_input", "expected_longest", "padded_per_batch", "run_positions"]

Tokens = tuple[int, int]
"""(micro-batch, positions per sample)."""


def token_input(inputs: list[dict[str, Any]] | None, engine_micro_batch: int = 0
                ) -> tuple[int, int] | None:
    """(micro-batch, tokens) of the first 2-D integer tensor the model's forward received; None where its first
    input is vectors (a float tensor of 3 or more dimensions: audio frames, images, embeddings), whose integer
    tensors are targets (a CTC model's (b, 40) labels were read as 40 tokens against its 300 frames). Batch first,
    unless only the second dimension is the engine's micro-batch (`engine_micro_batch`; 0: unknown): ids laid out
    sequence first, as nn.Transformer takes them without batch_first."""
    if inputs and _vectors_first(inputs):
        return None
    for item in inputs or []:
        if len(item["shape"]) == 2 and item["dtype"].startswith(("int", "uint")):
            return _batch_first(int(item["shape"][0]), int(item["shape"][1]), engine_micro_batch)
    return None


def _batch_first(first: int, second: int, engine_micro_batch: int) -> tuple[int, int]:
    """(batch, sequence) of a two-dimension layout: the second dimension is the batch where only it equals the engine's
    micro-batch (a sequence-first layout), else the first."""
    if engine_micro_batch and second == engine_micro_batch != first:
        return second, first
    return first, second


def _vectors_first(inputs: list[dict[str, Any]]) -> bool:
    first = inputs[0]
    return len(first["shape"]) >= 3 and first["dtype"].startswith(("float", "bfloat"))


def _block_tokens(rank0: Mapping[str, Any], hidden: int) -> tuple[int, int] | None:
    """(micro-batch, tokens) from the first block's input, (batch, sequence, hidden) or (sequence, batch, hidden):
    for a model whose forward gets no token ids (a ViT's image, an audio clip, embeddings computed outside). The
    batch is the dimension equal to the engine's micro-batch where only one is (a sequence-first model fed its
    vectors sequence first too: nn.TransformerEncoder without batch_first, whose (160, 1, ...) input at micro-batch 1
    had been read as 160 samples of 1 position, 2026-11-30), else the one equal to the model input's first; batch
    first when both are."""
    shapes = rank0.get("block_input") or []
    inputs = rank0.get("inputs") or []
    if not shapes or len(shapes[0]["shape"]) != 3 or shapes[0]["shape"][2] != hidden:
        return None
    first, second = int(shapes[0]["shape"][0]), int(shapes[0]["shape"][1])
    engine = int(rank0.get("train_micro_batch_size_per_gpu") or 0)
    if engine and (first == engine) != (second == engine):
        return _batch_first(first, second, engine)
    batch = int(inputs[0]["shape"][0]) if inputs and inputs[0]["shape"] else first
    return (second, first) if second == batch and first != batch else (first, second)


def expected_longest(lengths: Sequence[int], draws: float) -> float:
    """E[max of `draws` independent lengths] under the empirical distribution of `lengths`: sum over the distinct
    values v of v x (F(v)^n - F(v-)^n), F the empirical CDF; a real n interpolates."""
    values, counts = np.unique(np.asarray(lengths, dtype=float), return_counts=True)
    cdf = np.cumsum(counts) / counts.sum()
    below = np.concatenate([[0.0], cdf[:-1]])
    n = max(float(draws), 1.0)
    return float(np.sum(values * (cdf ** n - below ** n)))


def padded_per_batch(ranks: Sequence[Mapping[str, Any]], tokens: Tokens, read: list[str]
                      ) -> tuple[Tokens, int | None, tuple[int, ...]]:
    """(the positions to cost memory at, the positions the run's steps were paced by, each forward's positions) when
    the token inputs' length changed from forward to forward: a collator that pads each batch to its longest sample
    (Hugging Face's DataCollatorWithPadding, the Trainer's default with a tokenizer). Memory must hold the longest
    batch, so every configuration's memory is costed at the longest seen; a step goes at the pace of the rank with
    the longest batch (the ranks meet at every gradient reduction), so the run's steps went at the expected longest
    of one forward per rank (expected_longest), and `tune` costs each configuration's time at the expected longest of
    its own batches (zerotune.validate.tune: a micro-batch of b samples on d ranks pads toward the longest of b x d).
    The first forward's offset between the ids and the blocks' positions (a script that shifts its ids) is kept.
    Unchanged (None, ()) where the length held."""
    lengths = [int(n) for d in ranks for n in d.get("input_lengths") or []]
    rank0 = ranks[0] if ranks else {}
    first = token_input(rank0.get("inputs"), int(rank0.get("train_micro_batch_size_per_gpu") or 0))
    if len(set(lengths)) < 2 or first is None:
        return tokens, None, ()
    offset = first[1] - tokens[1]
    positions = tuple(n - offset for n in lengths)
    longest, paced = max(positions), round(expected_longest(positions, max(len(ranks), 1)))
    read.append(f"the inputs' length changed from forward to forward ({min(lengths)}-{max(lengths)} tokens over "
                f"{len(lengths)} forwards, mean {round(sum(lengths) / len(lengths))}: a collator that pads each batch "
                f"to its longest sample): memory is costed at the longest seen, {longest} positions, time at the "
                f"expected longest of each configuration's batches; --seq_len sets one length for both")
    return (tokens[0], longest), paced, positions


def _encoder_decoder_tokens(hf: Mapping[str, Any], tokens: Tokens, decoder: Tokens, read: list[str]) -> Tokens:
    """(micro-batch, positions) of an encoder-decoder (T5, BART by their config; nn.Transformer by its two stacks of
    modules, `hf` then holding only encoder_layers and decoder_layers) described as one stack of both (the catalog's
    zerotune.predictor.hf_config._hf_layers): the encoder runs over the input ids' length, the decoder over its own
    (the repeated block the hook sees is the decoder's, the larger with its cross-attention); the stack runs at
    their layer-weighted mean, so its layers x positions, what the GEMMs and activations scale with, are the
    model's."""
    encoder_layers = int(hf.get("encoder_layers") or hf.get("num_layers") or 1)
    decoder_layers = int(hf.get("decoder_layers") or hf.get("num_decoder_layers") or encoder_layers)
    mean = round((encoder_layers * tokens[1] + decoder_layers * decoder[1]) / (encoder_layers + decoder_layers))
    read.append(f"encoder-decoder: {encoder_layers} encoder layers over {tokens[1]} positions and {decoder_layers} "
                f"decoder layers over {decoder[1]} (the first decoder block's input): one stack of both at {mean}")
    return tokens[0], mean


def run_positions(model_doc: Mapping[str, Any], rank0: Mapping[str, Any], read: list[str]
               ) -> tuple[Tokens | None, Tokens | None]:
    """(what the blocks run over, where the first block's saved bytes were counted): the first token input, or the
    first block's input where the model gets no token ids or the two disagree at the same batch."""
    tokens = token_input(rank0.get("inputs"), int(rank0.get("train_micro_batch_size_per_gpu") or 0))
    if tokens:
        read.append(f"input {tokens[0]} x {tokens[1]} tokens (micro-batch x sequence) at the first forward")
    structure = model_doc.get("structure") or {}
    blocks_see = _block_tokens(rank0, int(structure.get("hidden_size") or 0)) if structure else None
    hf = model_doc.get("hf_config") or {}
    if tokens and blocks_see and blocks_see[0] == tokens[0] and blocks_see[1] != tokens[1]:
        if hf.get("is_encoder_decoder"):
            return _encoder_decoder_tokens(hf, tokens, blocks_see, read), blocks_see
        cross = int(structure.get("cross_attention_layers") or 0)
        if 0 < cross < int(structure.get("num_layers") or 0):  # nn.Transformer's two stacks (inspect_model)
            stacks = {"encoder_layers": int(structure["num_layers"]) - cross, "decoder_layers": cross}
            return _encoder_decoder_tokens(stacks, tokens, blocks_see, read), blocks_see
        # a script that feeds s + 1 ids and shifts them itself (inputs ids[:, :-1], targets ids[:, 1:]) runs its
        # blocks over s positions: the blocks' sequence is the one that costs time and memory
        read.append(f"the blocks run over {blocks_see[1]} positions (the first block's input)")
        return blocks_see, blocks_see
    if tokens and blocks_see == tokens and hf.get("is_encoder_decoder"):
        # the repeated block read is the encoder's (the stack holding the most parameters: BART with 3 encoder and
        # 2 decoder layers, 2026-11-30), so the decoder's length comes from its own ids or the labels
        decoder = next((i for i in rank0.get("inputs") or [] if i.get("name") in ("decoder_input_ids", "labels")
                        and len(i.get("shape") or ()) == 2), None)
        if decoder is not None:
            return _encoder_decoder_tokens(hf, tokens, (tokens[0], int(decoder["shape"][1])), read), blocks_see
    if tokens is None and blocks_see:  # no token ids seen (a ViT's images, embeddings passed in)
        read.append(f"input {blocks_see[0]} x {blocks_see[1]} vectors (micro-batch x sequence) at the first block")
        return blocks_see, blocks_see
    return tokens, tokens
