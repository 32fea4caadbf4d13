"""The profiling run (continued from test_profiled.py): its checks of the host (the matmul pace, subnormal gradients),
its retries after running out of memory or crashing, weights shared between blocks, recurrent and convolutional
blocks, and models built under ZeRO-3's Init."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import pytest

from zerotune.predictor import load_model
from zerotune.validate.profiled import read_profiled
from zerotune.validate.site_env import PROFILING_SITE

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
from zerotune.calibrate.inspect_model import describe  # noqa: E402
from tests.profiled_helpers import (SCRIPTS, fixture_script, profiled_yaml, profiling_site_module,  # noqa: E402
                                    write_profile)


@pytest.mark.parametrize("budget_s, edge", [(0.0, 512), (float("inf"), 2048)])
def test_a_device_too_slow_for_the_2048_matmul_is_timed_at_512(monkeypatch, budget_s: float, edge: int) -> None:
    # bf16 on a CPU without bf16 units ran the 2048^3 product at 0.27 GFLOP/s, 64 s each, seven times: one
    # profiling run took 7.5 minutes. A product that would pass the budget is timed at 512^3, one of the
    # calibration's squares too (data/profiles/cpu.json), so the pace still compares like with like.
    from zerotune.calibrate import site_paces  # what the profiling site loads from its file (calibrate/site_paces.py)
    monkeypatch.setattr(site_paces, "MATMUL_BUDGET_S", budget_s)

    class Engine:
        def bfloat16_enabled(self) -> bool:
            return False

    rate = site_paces.matmul_rate(Engine())
    assert (rate["m"], rate["dtype"]) == (edge, "fp32") and rate["flops_per_s"] > 0


def test_the_subnormal_check_times_the_hosts_gemms_at_three_shares_and_reads_back_a_factor() -> None:
    # calibrate/site_paces.py subnormal_rate on this machine, then the factor validate/profiled reads from it: at
    # least 1 whatever the host (an Intel host's assists make it several, an AMD EPYC host's about 1)
    from zerotune.calibrate import site_paces
    check = site_paces.subnormal_rate()
    assert check["shares"] == [0.0, 0.03, 0.3, 0.0] and len(check["seconds"]) == 4
    assert all(t > 0 for t in check["seconds"])
    from zerotune.validate.profiled import _subnormal_factor
    assert _subnormal_factor(check, 0.1) >= 1.0


def test_the_logits_gradients_subnormal_share_is_the_median_of_the_backward_passes(tmp_path: Path) -> None:
    """The CPU profiling run samples each backward's logits gradient (calibrate/profiling_site); the model carries
    the median, which the logits' backward GEMMs are costed with (ModelSpec.logits_grad_subnormal_share). Shares
    as the encoder fixture's run read them on 2026-11-27."""
    prefix = tmp_path / "profiled"
    inputs = [{"name": "input_ids", "shape": [1, 128], "dtype": "int64"}]
    shares = [0.027195, 0.027195, 0.02664, 0.022477, 0.028305, 0.017482, 0.01517, 0.01443]
    write_profile(prefix, fixture_script("encoder_mlm").MaskedLM(), inputs, logits_grad_subnormal_shares=shares)
    run = read_profiled(prefix, "enc", 2)
    assert run.model.logits_grad_subnormal_share == pytest.approx(0.024559, abs=1e-6)
    assert any("2.46% subnormal values" in line for line in run.read)
    path = profiled_yaml(tmp_path, run)
    assert load_model(str(path)).logits_grad_subnormal_share == pytest.approx(0.024559, abs=1e-6)
    write_profile(prefix, fixture_script("encoder_mlm").MaskedLM(), inputs)  # a GPU's run records none: nothing changes
    assert read_profiled(prefix, "enc", 2).model.logits_grad_subnormal_share == 0.0


@pytest.mark.parametrize("seconds,factor", [
    ([1.30e-3, 1.29e-3, 1.30e-3, 1.31e-3], 1.0),  # this project's AMD EPYC host, 2026-11-29: no assists
    ([1.0e-3, 7.5e-3, 10.0e-3, 1.2e-3], 1 + 6.5 * 0.024559 / 0.03),  # an Intel-like host: x7.5 at 3%, between 0 and 3%
])
def test_the_hosts_own_subnormal_slowdown_replaces_the_catalogs(tmp_path: Path, seconds: list[float],
                                                                 factor: float) -> None:
    """The profiling run times GEMMs with 0, 3% and 30% subnormal operands on its host (calibrate/site_paces.py
    subnormal_rate); the logits' backward GEMMs are costed with that host's slowdown at the share the run read
    (ModelSpec.logits_grad_subnormal_factor), not the catalog's Intel-measured x(1 + 195 x share): on a host without
    microcode assists a script whose logits' gradient was 17% subnormal had been predicted 2.8x too slow."""
    prefix = tmp_path / "profiled"
    inputs = [{"name": "input_ids", "shape": [1, 128], "dtype": "int64"}]
    shares = [0.027195, 0.027195, 0.02664, 0.022477, 0.028305, 0.017482, 0.01517, 0.01443]
    check = {"shares": [0.0, 0.03, 0.3, 0.0], "seconds": seconds, "shape": [256, 1024, 256]}
    write_profile(prefix, fixture_script("encoder_mlm").MaskedLM(), inputs, logits_grad_subnormal_shares=shares,
                   subnormal=check)
    run = read_profiled(prefix, "enc", 2)
    assert run.model.logits_grad_subnormal_factor == pytest.approx(factor, rel=1e-3)
    assert any(f"x{factor:.3g} its normal time on this host" in line for line in run.read)
    assert load_model(str(profiled_yaml(tmp_path, run))).logits_grad_subnormal_factor == pytest.approx(factor, rel=1e-3)
    # beyond the largest share timed the slowdown stays there (the assists saturate)
    from zerotune.validate.profiled import _subnormal_factor
    assert _subnormal_factor(check, 0.9) == pytest.approx(max(1.0, seconds[2] / min(seconds[0], seconds[3])))
    assert _subnormal_factor({"error": "RuntimeError: x"}, 0.02) is None


def test_a_profiling_run_out_of_memory_tries_again_at_the_highest_stage_and_the_search_starts_from_the_oom(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose ZeRO-0 states do not fit (a 7B model's 16 bytes a parameter of Adam on one 80 GB GPU) made the
    profiling run, at the ds_config's first stage, fail the whole tune as if every experiment would. It now profiles
    again at the highest listed stage, as DeepSpeed's autotuner profiles every model at stage 3
    (autotuning/constants.py DEFAULT_MIN_MEM_CONFIG), and the first try counts as an OOM of its configuration."""
    from zerotune.calibrate.launch import RunResult
    from zerotune.validate.experiments import UserCommand
    from zerotune.validate.profiling_run import profile_model
    from zerotune.validate.settings import TuneSettings

    monkeypatch.chdir(tmp_path)
    stages: list[int] = []

    def launcher(spec):  # type: ignore[no-untyped-def]
        stage = spec.ds_config["zero_optimization"]["stage"]
        stages.append(stage)
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        if stage == 0:
            (spec.run_dir / "stderr.log").write_text("torch.OutOfMemoryError: CUDA out of memory.")
            return RunResult("oom", "out of memory", 1, 5.0, spec.run_dir, None)
        write_profile(spec.run_dir / "profiled", fixture_script("encoder_mlm").MaskedLM(),  # steps past warm-up (3)
                       [{"name": "input_ids", "shape": [1, 128], "dtype": "int64"}], step_s=[2.0, 1.0, 1.2, 1.1, 1.0])
        return RunResult("ok", "", 0, 20.0, spec.run_dir, None)

    doc = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": [0, 1, 3]},
           "autotuning": {"results_dir": "results", "exps_dir": "exps"}}
    script = SCRIPTS / "encoder_mlm.py"
    settings = TuneSettings(UserCommand(script, ("--deepspeed",), "--deepspeed_config", tmp_path / "ds.json"), doc,
                            "", "cpu", 2)
    lines: list[str] = []
    outcome = profile_model(settings, launcher, log=lines.append)
    assert stages == [0, 3]
    assert outcome.measurement is not None and outcome.measurement.config.zero.stage == 3
    oom = outcome.out_of_memory
    assert oom is not None and oom.status == "oom" and oom.config.zero.stage == 0
    assert oom.config.train_micro_batch_size_per_gpu == 1 and oom.source.endswith("profile_oom_z0")
    assert (tmp_path / "results" / "profile_oom_z0" / "stderr.log").is_file()  # the first try's logs are kept
    assert any("out of memory at ZeRO stage 0" in line and "stage 3" in line for line in lines)

    # the search starts from it: no ZeRO-0 configuration may fit, whatever the model predicts
    from zerotune.validate.plan import build_job
    from zerotune.predictor.space import space_from_ds_config
    from zerotune.validate.calibration import load_profile_for
    from zerotune.validate.search import candidate_table, fit_probabilities, observation_of
    eff, uncertainty = load_profile_for("cpu")
    job = build_job(outcome.model_path, "cpu", 1, 2, outcome.seq_len)
    table = candidate_table(job, space_from_ds_config(doc, world_size=2, explore=()), eff, "throughput")
    obs = [observation_of(job, eff, m) for m in (oom, outcome.measurement)]
    cands = table.candidates
    p_fit = fit_probabilities(cands, obs, uncertainty)
    stage = np.array([cands.families[k][0] for k in cands.family])
    assert (p_fit[stage == 0] == 0).all() and (p_fit[stage == 3] > 0).any()


@pytest.mark.parametrize("stage3_trains", [True, False])
def test_a_profiling_run_that_crashes_below_stage_3_tries_stage_3_and_leaves_the_lower_stages_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage3_trains: bool) -> None:
    """A script that builds its model under deepspeed.zero.Init (no `enabled=` guard) trains only at stage 3: below it
    the engine runs the partitioned, empty weights and the forward fails ("'weight' must be 2-D", DeepSpeed 0.19.8).
    With `stage: all` the profiling run at stage 0 had stopped the tune, saying every experiment would fail the
    same way. It now profiles at stage 3 as DeepSpeed's autotuner does, and tunes only the stages it trained at;
    a script that fails at stage 3 too still stops in one line naming both tries."""
    from zerotune.calibrate.launch import RunResult
    from zerotune.validate.experiments import UserCommand
    from zerotune.validate.profiling_run import profile_model, trainable_space
    from zerotune.validate.settings import TuneSettings
    from zerotune.predictor.space import space_from_ds_config

    monkeypatch.chdir(tmp_path)
    stages: list[int] = []
    crash = "failed: RuntimeError: 'weight' must be 2-D"

    def launcher(spec):  # type: ignore[no-untyped-def]
        stage = spec.ds_config["zero_optimization"]["stage"]
        stages.append(stage)
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        if stage < 3 or not stage3_trains:
            (spec.run_dir / "stderr.log").write_text("RuntimeError: 'weight' must be 2-D")
            return RunResult("failed", crash, 1, 5.0, spec.run_dir, None)
        write_profile(spec.run_dir / "profiled", fixture_script("encoder_mlm").MaskedLM(),
                       [{"name": "input_ids", "shape": [1, 128], "dtype": "int64"}], step_s=[2.0, 1.0, 1.2, 1.1, 1.0])
        return RunResult("ok", "", 0, 20.0, spec.run_dir, None)

    doc = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": "all"},
           "autotuning": {"results_dir": "results", "exps_dir": "exps"}}
    settings = TuneSettings(UserCommand(SCRIPTS / "encoder_mlm.py", ("--deepspeed",), "--deepspeed_config",
                                        tmp_path / "ds.json"), doc, "", "cpu", 2)
    lines: list[str] = []
    if not stage3_trains:
        with pytest.raises(ValueError) as err:
            profile_model(settings, launcher, log=lines.append)
        assert stages == [0, 3] and "at ZeRO stage 0 before it: the same way" in str(err.value)
        # zerotune's own instrumentation may be what failed: the way around it is named
        assert "profile/ds_config.json, the profiling run's instrumentation is at fault: give --model" in str(err.value)
        assert "\n" not in str(err.value)
        return
    outcome = profile_model(settings, launcher, log=lines.append)
    assert stages == [0, 3] and outcome.min_stage == 3
    assert outcome.out_of_memory is None  # a crash is not an OOM the memory model should learn from
    assert (tmp_path / "results" / "profile_failed_z0" / "stderr.log").is_file()
    assert any("failed (failed: RuntimeError: 'weight' must be 2-D) at ZeRO stage 0" in line for line in lines)
    assert any("stages below 3 are left out" in line for line in lines)
    space = trainable_space(replace(settings, script_min_stage=outcome.min_stage),
                            space_from_ds_config(doc, world_size=2, explore=()))
    assert {v.zero.stage for v in space.variants} == {3}


def test_a_profiling_run_out_of_memory_at_the_highest_stage_already_says_so_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from zerotune.calibrate.launch import RunResult
    from zerotune.validate.experiments import UserCommand
    from zerotune.validate.profiling_run import profile_model
    from zerotune.validate.settings import TuneSettings

    monkeypatch.chdir(tmp_path)
    stages: list[int] = []

    def launcher(spec):  # type: ignore[no-untyped-def]
        stages.append(spec.ds_config["zero_optimization"]["stage"])
        return RunResult("oom", "out of memory", 1, 5.0, spec.run_dir, None)

    doc = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": [1, 2]},
           "autotuning": {"results_dir": "results", "exps_dir": "exps"}}
    settings = TuneSettings(UserCommand(SCRIPTS / "encoder_mlm.py", (), "--deepspeed_config", tmp_path / "ds.json"),
                            doc, "", "cpu", 2)
    with pytest.raises(ValueError, match=r"failed .*\(oom: out of memory; see .*\) \(and at ZeRO stage 1 before it, "
                                         r"out of memory too\)") as exc:
        profile_model(settings, launcher, log=lambda _: None)
    assert stages == [1, 2] and "\n" not in str(exc.value)


def test_a_factorized_embedding_is_read_at_its_own_width_and_the_blocks_at_theirs(tmp_path: Path) -> None:
    """ElectraForMaskedLM: 128-wide embedding tables, 256-wide blocks, a head that projects 256 -> 128 before the tied
    vocabulary projection. The embedding's width had been taken for the blocks' (the head then went unread, and
    with it the logits' GEMMs)."""
    transformers = pytest.importorskip("transformers")
    model = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        vocab_size=5000, embedding_size=128, hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=1024, max_position_embeddings=256))
    structure = describe(model)["structure"]
    assert (structure["hidden_size"], structure["embedding_size"], structure["head"], structure["head_transform"]) == \
        (256, 128, "lm", True)
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "input_ids", "shape": [2, 128], "dtype": "int64"}])
    m = read_profiled(prefix, "hf-electra", 2).model
    assert (m.hidden_size, m.embedding_size, m.head, m.tied_embeddings) == (256, 128, "lm", True)
    assert m.num_params == sum(p.numel() for p in model.parameters())


class _LoopedEncoder(torch.nn.Module):
    """A universal-transformer-style encoder: one block's weights run PASSES times a forward."""

    PASSES = 4

    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(1000, 64)
        self.blocks = torch.nn.ModuleList([torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)])
        self.head = torch.nn.Linear(64, 1000)
        self.checkpointed = checkpointed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids)
        for _ in range(self.PASSES):
            x = (torch.utils.checkpoint.checkpoint(self.blocks[0], x, use_reentrant=False) if self.checkpointed
                 else self.blocks[0](x))
        return self.head(x).float().logsumexp(-1).mean()


def _site_counts(model: torch.nn.Module, blocks: torch.nn.Module, run: Callable[[], None],
                 monkeypatch: pytest.MonkeyPatch, steps: int = 2) -> dict:
    """The block call counts the profiling site records in the user's process over `steps` forward + backward (the
    site wraps F.scaled_dot_product_attention for the process; monkeypatch puts it back after the test)."""
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        torch.nn.functional.scaled_dot_product_attention)
    spec = importlib.util.spec_from_file_location("zt_site_shared", PROFILING_SITE / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(site)  # type: ignore[union-attr]
    state = {"forward_calls": 0, "block_calls": 0, "inner_calls": 0, "block_forward_calls": 0,
             "inner_forward_calls": 0, "in_forward": False, "inputs": None, "input_lengths": [], "step_start": 0.0,
             "block_input": None, "block_saved_bytes": 0, "block_saved_calls": 0, "sdpa_calls": 0,
             "sdpa_shapes": None, "sdpa_dropout_p": 0.0, "attention_matmul": None}
    site._hooks(SimpleNamespace(module=model), state, blocks)
    for _ in range(steps):
        run()
    return {k: state[k] for k in ("forward_calls", "block_calls", "inner_calls", "block_forward_calls",
                                  "inner_forward_calls")}


@pytest.mark.parametrize("checkpointed", [False, True])
def test_blocks_that_share_weights_are_costed_per_pass_and_held_once(tmp_path: Path, checkpointed: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A block run four times a forward (shared weights) had read as activation checkpointing (more than one call a
    micro-step) and as one block; the site now tells calls inside the model's forward from backward's recomputes."""
    model = _LoopedEncoder(checkpointed)
    ids = torch.randint(0, 1000, (2, 32))
    counts = _site_counts(model, model.blocks, lambda: model(ids).backward(), monkeypatch)
    passes = _LoopedEncoder.PASSES
    assert counts["forward_calls"] == 2 and counts["block_forward_calls"] == 2 * passes
    # recomputed in backward: every pass. Non-reentrant checkpointing packs the saved tensors with hooks of its own,
    # under which the site counts nothing (calibrate/site_counts.py outer_saved_tensor_hooks); its own hooks had taken the
    # place of the checkpoint's in the first pass, which then kept its activations on this rank alone (under ZeRO-3
    # the ranks' gathers in backward went out of step: a gloo size mismatch)
    assert counts["block_calls"] - counts["block_forward_calls"] == (2 * passes if checkpointed else 0)
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "ids", "shape": [2, 32], "dtype": "int64"}], **counts)
    run = read_profiled(prefix, "looped", 2)
    assert run.activation_checkpointing == checkpointed
    assert (run.model.num_layers, run.model.distinct_layers) == (passes, 1)
    assert run.model.num_params == pytest.approx(sum(p.numel() for p in model.parameters()), rel=0.01)
    assert any("shared weights" in line for line in run.read)


def test_albert_runs_its_shared_layers_each_pass_and_holds_their_weights_once(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """AlbertForMaskedLM, 6 layers over 2 groups of 1: its config's layers run (FLOPs), its groups' weights held."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AlbertForMaskedLM(transformers.AlbertConfig(
        vocab_size=3000, embedding_size=64, hidden_size=128, num_attention_heads=4, intermediate_size=512,
        num_hidden_layers=6, num_hidden_groups=2, max_position_embeddings=128))
    ids = torch.randint(0, 3000, (2, 32))
    blocks = model.albert.encoder.albert_layer_groups
    counts = _site_counts(model, blocks, lambda: model(input_ids=ids, labels=ids).loss.backward(), monkeypatch)
    assert counts["block_forward_calls"] == counts["block_calls"] == 2 * 3  # the first group runs 3 of the 6 layers
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "input_ids", "shape": [2, 32], "dtype": "int64"}], **counts)
    run = read_profiled(prefix, "albert", 2)
    assert not run.activation_checkpointing
    assert (run.model.num_layers, run.model.distinct_layers) == (6, 2)
    assert run.model.num_params == sum(p.numel() for p in model.parameters())


def test_a_hierarchical_vision_model_is_described_by_a_stand_in_of_its_measured_costs(tmp_path: Path) -> None:
    """SwinForImageClassification: its stages widen (32 -> 64 here; swin-tiny 96 -> 768) while the tokens shrink, so no
    one block describes it. Its ModuleList of stages had been read as two repeated blocks 32 wide, 75% of its
    parameters unseen; the stages are not repeated blocks now (their shapes differ), the stacks of blocks inside them
    run at two widths, and the site measures the whole model's forward FLOPs and kept bytes, which the stand-in
    reproduces with the model's parameter count."""
    transformers = pytest.importorskip("transformers")
    from zerotune.calibrate.inspect_model import readable
    from zerotune.predictor.activations import layer_activation_bytes
    from zerotune.predictor.flops import layer_forward_flops
    model = transformers.SwinForImageClassification(transformers.SwinConfig(
        image_size=64, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4))
    doc = describe(model)
    assert doc["structure"] is None and "different widths" in doc["error"] and not readable(doc)
    spec = importlib.util.spec_from_file_location("zt_site_swin", PROFILING_SITE / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(site)  # type: ignore[union-attr]
    state = {"model_saved_bytes": 0, "model_saved_calls": 0, "model_forward_flops": 0}
    site._counts().count_saved(model, model, state, "model")
    site._counts().count_flops(model, state)
    images = torch.randn(2, 3, 64, 64)
    model(pixel_values=images, labels=torch.tensor([0, 1])).loss.backward()
    prefix = tmp_path / "profiled"
    write_profile(prefix, model, [{"name": "pixel_values", "shape": [2, 3, 64, 64], "dtype": "float32"}],
                   stand_in=True, train_micro_batch_size_per_gpu=2, **state)
    run = read_profiled(prefix, "swin", 2)
    counted = sum(p.numel() for p in model.parameters())
    assert run.model.num_params == pytest.approx(counted, rel=0.01)  # whole blocks: rounding only
    per_sample = run.model.num_layers * layer_forward_flops(run.model, 1, run.seq_len)
    assert per_sample == pytest.approx(state["model_forward_flops"] / 2, rel=0.03)
    kept = run.model.num_layers * layer_activation_bytes(run.model, 2, run.seq_len, 4)
    assert kept == pytest.approx(state["model_saved_bytes"], rel=1e-3)
    assert any("stacks of repeated blocks at different widths" in line for line in run.read)  # why, in one line


class _RecurrentLM(torch.nn.Module):
    """An embedding, a two-layer recurrent network and a vocabulary head: no transformer block (a stand-in model)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.emb = torch.nn.Embedding(1000, 128)
        self.rnn = getattr(torch.nn, kind)(128, 256, num_layers=2, batch_first=True, bidirectional=kind == "GRU")
        self.out = torch.nn.Linear(256 * (2 if kind == "GRU" else 1), 1000)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.emb(ids))[0]).logsumexp(-1).mean()


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_the_site_counts_a_recurrent_layers_forward_flops(kind: str) -> None:
    """torch 2.13's CPU nn.LSTM runs one fused op that FlopCounterMode has no formula for: an LSTM language model's
    stand-in had been built from its head's FLOPs alone. The site counts a layer the counter missed by hand (2 x
    gates x hidden x (input + hidden) a position, each layer and direction); a GRU, which the counter sees through its
    decomposed matmuls, is not counted twice. The same forward's dispatched ops are counted (each costs the host a
    dispatch whatever its size): the GRU decomposes into thousands a forward, every position of every layer and
    direction, the LSTM into one fused op a layer; as many as a dispatch mode of the test's own sees (one more: the
    site's counting runs beside torch's FLOP counter), and the count stops after the first forward."""
    from torch.utils.flop_counter import FlopCounterMode

    from zerotune.calibrate.site_counts import op_counter
    site = profiling_site_module()
    model = _RecurrentLM(kind)
    ids = torch.randint(0, 1000, (4, 32))
    state = {"model_forward_flops": 0}
    site._counts().count_flops(model, state)
    model(ids).backward()
    first = state["model_forward_ops"]
    model(ids).backward()
    assert state["model_forward_ops"] == first
    with op_counter(torch) as ops:
        model(ids)
    assert abs(first - ops.count) <= 1
    assert (first > 2 * 2 * 32 * (2 if kind == "GRU" else 1)) == (kind == "GRU")  # ops a position, or one fused op
    positions, gates, directions = 4 * 32, {"LSTM": 4, "GRU": 3}[kind], 2 if kind == "GRU" else 1
    rnn = sum(directions * 2 * gates * 256 * (width + 256) * positions for width in (128, 256 * directions))
    head = 2 * positions * 256 * directions * 1000
    assert state["model_forward_flops"] == pytest.approx(rnn + head, rel=1e-6)
    with FlopCounterMode(display=False) as counter:
        model(ids)
    assert (counter.get_total_flops() == head) == (kind == "LSTM")  # what the counter alone saw


class _ConvModule(torch.nn.Module):
    """A Conformer block's convolution module: pointwise, depthwise over time, pointwise."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.norm, self.bn = torch.nn.LayerNorm(h), torch.nn.BatchNorm1d(h)
        self.pointwise_in = torch.nn.Conv1d(h, 2 * h, 1)
        self.depthwise = torch.nn.Conv1d(h, h, 15, padding=7, groups=h)
        self.pointwise_out = torch.nn.Conv1d(h, h, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.glu(self.pointwise_in(self.norm(x).transpose(1, 2)), dim=1)
        return x + self.pointwise_out(torch.nn.functional.silu(self.bn(self.depthwise(y)))).transpose(1, 2)


class _ConformerBlock(torch.nn.Module):
    def __init__(self, h: int = 64) -> None:
        super().__init__()
        self.ff1 = torch.nn.Sequential(torch.nn.LayerNorm(h), torch.nn.Linear(h, 4 * h), torch.nn.SiLU(),
                                       torch.nn.Linear(4 * h, h))
        self.attn = torch.nn.MultiheadAttention(h, 4, batch_first=True)
        self.conv = _ConvModule(h)
        self.ff2 = torch.nn.Sequential(torch.nn.LayerNorm(h), torch.nn.Linear(h, 4 * h), torch.nn.SiLU(),
                                       torch.nn.Linear(4 * h, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + 0.5 * self.ff2(self.conv(x))


def test_a_block_holding_convolutions_is_described_by_a_stand_in_not_as_a_transformer_block() -> None:
    """A Conformer block: its two feed-forward modules were read as one gated MLP and its convolution module not at
    all (the model described at 2.37M of its 3.63M parameters); a block with more than a tenth of its parameters in
    modules a transformer block has not is not read as one, and the model's measured costs stand in for it."""
    from zerotune.calibrate.inspect_model import readable
    model = torch.nn.Sequential(torch.nn.Linear(80, 64), torch.nn.ModuleList(_ConformerBlock() for _ in range(3)))
    doc = describe(model)
    assert doc["structure"] is None and "Conv1d" in doc["error"] and not readable(doc)


def _as_zero3_partitions(model: torch.nn.Module) -> torch.nn.Module:
    """The model as deepspeed.zero.Init leaves it on a rank (runtime/zero/partition_parameters.py): every parameter's
    tensor emptied, its full shape and size kept in ds_shape and ds_numel."""
    for p in model.parameters():
        if not hasattr(p, "ds_shape"):
            p.ds_shape, p.ds_numel = p.shape, p.numel()
            p.data = torch.empty(0, dtype=p.dtype)
    return model


@pytest.mark.parametrize("script, cls", [("nanogpt_loop", "GPT"), ("decoder_lm", "Decoder"),
                                         ("eval_checkpointed_gpt", "GPT"), ("encoder_mlm", "MaskedLM")])
def test_a_model_built_under_zero_init_reads_as_its_full_shapes(script: str, cls: str) -> None:
    """A script that builds its model under deepspeed.zero.Init (ZeRO-3) hands the engine empty tensors; the block's
    norms had read 0 wide, so a GPT of 6 x 192 read as a 'factorized embedding' of width 0, no MLP found, and the
    profiling run fell back to a stand-in (a helper's script, 2026-11-29). Every shape is read from ds_shape."""
    full = describe(getattr(fixture_script(script), cls)())
    partitioned = describe(_as_zero3_partitions(getattr(fixture_script(script), cls)()))
    assert full["structure"] is not None
    assert partitioned["structure"] == full["structure"] and partitioned["num_params"] == full["num_params"]


def test_the_matmul_check_is_taken_again_at_exit_and_the_faster_kept(tmp_path: Path) -> None:
    """A shared machine's slow spell can span the check before the first step (this VM, 2026-11-29: 77 and 83 GFLOP/s
    where every other run read 90-96); rank 0 checks again as it exits and keeps the faster reading, so a slow spell
    must span both to mis-pace the tune."""
    spec = importlib.util.spec_from_file_location("zt_profiling_site", PROFILING_SITE / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(site)  # type: ignore[union-attr]

    class Engine:  # fp32: neither bf16 nor fp16
        pass
    path = tmp_path / "profile.rank0.json"
    edge = site._paces().matmul_rate(Engine())["m"]  # 2048 here; a device too slow for it times a smaller product
    slow = {"m": edge, "n": edge, "k": edge, "dtype": "fp32", "flops_per_s": 1.0}
    state = {"matmul": dict(slow)}
    site._recheck_matmul(Engine(), state, str(path))
    written = json.loads(path.read_text())["matmul"]
    assert written["flops_per_s"] > 1e8 and written["first_flops_per_s"] == 1.0 and written["m"] == edge
    # a first check faster than the second stands, and nothing is rewritten
    path.unlink()
    fast = {**slow, "flops_per_s": 1e18}
    state = {"matmul": dict(fast)}
    site._recheck_matmul(Engine(), state, str(path))
    assert state["matmul"] == fast and not path.exists()

