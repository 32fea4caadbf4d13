"""The micro-batch and positions the profiling run reads from the first forward's inputs, whichever dimension the
script puts its batch in (validate/profiled_inputs.py)."""

from __future__ import annotations

from zerotune.validate.profiled_inputs import run_positions, token_input


def _tensor(shape: list[int], dtype: str) -> dict[str, object]:
    return {"name": "x", "shape": shape, "dtype": dtype}


def test_token_ids_laid_out_sequence_first_are_read_by_the_engines_micro_batch() -> None:
    """nn.Transformer without batch_first takes (sequence, batch) ids: at the profiling run's micro-batch 1 a
    (160, 1) input is 1 sample of 160 tokens, not 160 samples of 1; the engine's micro-batch tells the two apart,
    and without it, or where both dimensions could be it, the batch stays first."""
    assert token_input([_tensor([160, 1], "int64")], engine_micro_batch=1) == (1, 160)
    assert token_input([_tensor([1, 160], "int64")], engine_micro_batch=1) == (1, 160)
    assert token_input([_tensor([160, 1], "int64")]) == (160, 1)
    assert token_input([_tensor([4, 4], "int64")], engine_micro_batch=4) == (4, 4)
    assert token_input([_tensor([4, 129], "int64")], engine_micro_batch=1) == (4, 129)  # the script batches itself


def test_vectors_fed_sequence_first_reach_the_blocks_as_one_sample_of_many_positions() -> None:
    """A user's nn.TransformerEncoder without batch_first, fed float features (sequence, batch, features): its first
    block's input (160, 1, hidden) at micro-batch 1 had been read as 160 samples of 1 position (2026-11-30: its
    profiling run predicted 2.4x its measured 44.8 samples/s, its first experiment 1,700 against about 60)."""
    rank0 = {"inputs": [_tensor([160, 1, 24], "float32")], "block_input": [_tensor([160, 1, 96], "float32")],
             "train_micro_batch_size_per_gpu": 1}
    doc = {"structure": {"hidden_size": 96, "num_layers": 3}}
    read: list[str] = []
    assert run_positions(doc, rank0, read) == ((1, 160), (1, 160))
    batch_first = {**rank0, "inputs": [_tensor([1, 160, 24], "float32")],
                   "block_input": [_tensor([1, 160, 96], "float32")]}
    assert run_positions(doc, batch_first, []) == ((1, 160), (1, 160))
    unknown = {key: value for key, value in rank0.items() if key != "train_micro_batch_size_per_gpu"}
    assert run_positions(doc, unknown, []) == ((160, 1), (160, 1))  # the input's first dimension decides, as before


def test_an_encoder_decoder_read_at_its_encoder_takes_the_decoders_length_from_its_labels() -> None:
    """A Hugging Face encoder-decoder whose encoder stack holds more parameters than its decoder (BART with 3 encoder
    and 2 decoder layers) is hooked at an encoder block, which runs at the source length: the decoder's 2 layers had
    been costed at it too. Its labels give the decoder's length, and the stack runs at the layer-weighted mean."""
    rank0 = {"inputs": [_tensor([8, 100], "int64"), {**_tensor([8, 40], "int64"), "name": "labels"}],
             "block_input": [_tensor([8, 100, 288], "float32")], "train_micro_batch_size_per_gpu": 8}
    doc = {"structure": {"hidden_size": 288, "num_layers": 5},
           "hf_config": {"is_encoder_decoder": True, "encoder_layers": 3, "decoder_layers": 2}}
    read: list[str] = []
    assert run_positions(doc, rank0, read) == ((8, round((3 * 100 + 2 * 40) / 5)), (8, 100))
    assert any("encoder-decoder" in line for line in read)
