"""helpers.memory: the timeline by category, top allocations, checkpointing, CUDA snapshots (GPU only)."""
import pytest
import torch

from helpers import memory

WIDTH, BATCH = 32, 16


@pytest.fixture(scope="module")
def profiled():
    torch.manual_seed(0)
    model = memory.mlp(WIDTH, 2)
    prof = memory.profile_steps(memory.training_step(model, BATCH, WIDTH), steps=1)
    top = memory.top_allocations(prof, 5)          # before the export (see lesson 07, pitfall 3)
    return model, top, memory.timeline(prof)


def test_timeline_categories_match_the_model(profiled):
    model, _, tl = profiled
    params = list(model.parameters())
    param_bytes = 4 * sum(p.numel() for p in params)
    assert set(tl["bytes"]) >= {"parameter", "activation", "gradient", "optimizer_state", "input"}
    assert memory.peak_bytes(tl, "parameter") == param_bytes
    assert memory.peak_bytes(tl, "gradient") == param_bytes
    assert memory.peak_bytes(tl, "optimizer_state") == 2 * param_bytes + 4 * len(params)
    assert memory.peak_bytes(tl, "input") >= 4 * BATCH * (WIDTH + 1)
    assert memory.peak_bytes(tl) >= 4 * param_bytes
    assert tl["times_us"][0] == 0 and tl["times_us"] == sorted(tl["times_us"])


def test_exporter_deprecation_is_returned(profiled):
    _, _, tl = profiled
    assert any(w.startswith("FutureWarning: `export_memory_timeline` is deprecated") for w in tl["warnings"])


def test_top_allocations_sorted_and_positive(profiled):
    _, top, _ = profiled
    assert top and all(r["self_bytes"] > 0 for r in top)
    assert [r["self_bytes"] for r in top] == sorted((r["self_bytes"] for r in top), reverse=True)
    assert any(r["op"] in ("aten::mm", "aten::addmm") for r in top)


def test_bad_arguments_raise_clear_errors(profiled):
    _, _, tl = profiled
    with pytest.raises(ValueError, match="unknown category 'weights'"):
        memory.peak_bytes(tl, "weights")
    with pytest.raises(ValueError, match="steps must be >= 1"):
        memory.profile_steps(lambda: None, steps=0)
    bare = memory.profile_steps(lambda: torch.ones(4) + 1, steps=1)
    with pytest.raises(ValueError, match="no memory events for device 'cuda:0'"):
        memory.timeline(bare, device="cuda:0")


def test_timeline_needs_all_three_profiler_options():
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.ones(8) + 1
    with pytest.raises(ValueError, match="record_shapes=True, with_stack=True required"):
        memory.timeline(prof)


def test_checkpointed_mlp_computes_the_same_and_stores_less():
    torch.manual_seed(0)
    plain = memory.mlp(WIDTH, 3)
    torch.manual_seed(0)
    ckpt = memory.mlp(WIDTH, 3, checkpointed=True)
    x = torch.randn(BATCH, WIDTH)
    torch.testing.assert_close(ckpt(x), plain(x))
    result = memory.checkpoint_comparison(batch=64, width=WIDTH, depth=3, steps=1, repeats=1, min_run_time=0.01)
    act = result["activation_peak_bytes"]
    assert act["checkpointed"] < act["stored activations"]


def test_figure_has_one_trace_per_nonzero_category(profiled):
    _, _, tl = profiled
    fig = memory.timeline_figure(tl)
    assert {t.name for t in fig.data} == {k for k, v in tl["bytes"].items() if any(v)}


@pytest.mark.requires_cuda
def test_snapshot_and_nested_pools_on_gpu():
    snap = memory.record_history(lambda: torch.randn(1024, 1024, device="cuda").sum())
    summary = memory.snapshot_summary(snap)
    assert summary["segments"] >= 1 and summary["events"].get("alloc", 0) >= 1
    held = memory.nested_pools(1 << 20)
    assert held["inner"] >= 2 << 20 and held["outer"] >= 2 << 20


def test_largest_allocations_point_at_the_caller_and_the_snapshot_is_written(tmp_path):
    import os
    import pickle
    torch_file = os.sep.join(["", "site-packages", "torch", "nn", "modules", "linear.py"])
    snapshot = {"segments": [], "device_traces": [[
        {"action": "alloc", "size": 4096, "frames": [{"filename": torch_file, "line": 125, "name": "forward"},
                                                     {"filename": "model.py", "line": 7, "name": "step"}]},
        {"action": "free_requested", "size": 4096, "frames": []},
        {"action": "alloc", "size": 64, "frames": []}]]}
    assert memory.largest_allocations(snapshot, n=2) == [
        {"bytes": 4096, "where": "model.py:7 in step"}, {"bytes": 64, "where": "(no Python frame)"}]
    path = memory.dump_snapshot(snapshot, tmp_path / "runs" / "s.pickle")
    assert pickle.loads(path.read_bytes()) == snapshot
