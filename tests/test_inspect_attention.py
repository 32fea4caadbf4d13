"""Attention read from a block's linears where its width is not the hidden size (calibrate/inspect_model.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn


class _NarrowBlock(nn.Module):
    """GPT-J-style parallel block: 5 heads of 48 in a 320-wide block (attention 240 wide), fused q, k, v."""

    def __init__(self, kv: int = 240) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(320)
        self.qkv = nn.Linear(320, 240 + 2 * kv, bias=False)
        self.out = nn.Linear(240, 320, bias=False)
        self.fc_in, self.fc_out = nn.Linear(320, 1280), nn.Linear(1280, 320)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _Model(nn.Module):
    def __init__(self, kv: int = 240) -> None:
        super().__init__()
        self.wte = nn.Embedding(5003, 320)
        self.blocks = nn.ModuleList(_NarrowBlock(kv) for _ in range(5))
        self.ln_f = nn.LayerNorm(320)


@pytest.mark.parametrize("kv, kv_heads", [(240, 5), (48, 1)])
def test_attention_narrower_than_the_block_is_read_with_its_own_head_width(kv: int, kv_heads: int) -> None:
    """A user's block whose heads x head width (5 x 48 = 240) is not its hidden size (320) had been read as having no
    attention at all ('an MLP's alone'), and the model described by a stand-in of 10 MLP blocks, vocabulary 0
    (2026-11-30). Its output projection 240 -> 320 and fused projection 320 -> 240 + 2 kv say the width."""
    from zerotune.calibrate.inspect_model import describe
    from zerotune.predictor.model import ModelSpec
    model = _Model(kv)
    doc = describe(model)
    structure = doc["structure"]
    assert structure is not None, doc.get("error")
    assert (structure["num_layers"], structure["hidden_size"], structure["ffn_hidden_size"],
            structure["vocab_size"]) == (5, 320, 1280, 5003)
    assert (structure["num_heads"], structure["attention_head_dim"], structure["num_kv_heads"]) == (5, 48, kv_heads)
    spec = ModelSpec(name="narrow", max_position_embeddings=80, source="test", **{
        k: v for k, v in structure.items() if k in ModelSpec.__dataclass_fields__})
    block = sum(p.numel() for p in model.blocks[0].parameters())
    assert spec.num_layer_params == pytest.approx(block, rel=0.01)
