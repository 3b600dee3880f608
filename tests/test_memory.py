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
    top = memory.top_allocations(prof, 5)
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


def test_unknown_memory_is_named_by_the_op_that_made_it():
    """On the CPU, Adam runs its per-parameter loop (_single_tensor_adam): the denominators it builds
    (exp_avg_sq.sqrt() / ...) are the tensors no rule of the exporter categorises."""
    torch.manual_seed(0)
    step = memory.training_step(memory.mlp(WIDTH, 2), BATCH, WIDTH)
    step()                                          # Adam's state exists, as in any step but the first
    prof = memory.profile_steps(step, steps=1)
    groups = memory.uncategorized(prof, n=10)
    assert groups and [g["bytes"] for g in groups] == sorted((g["bytes"] for g in groups), reverse=True)
    assert all(g["bytes"] > 0 and g["tensors"] >= 1 for g in groups)
    assert "adam" in groups[0]["caller"] and groups[0]["op"].startswith("aten::"), groups
    assert max(memory.timeline(prof)["bytes"]["unknown"]) > 0


def test_training_step_puts_the_batch_on_the_device():
    model = memory.mlp(WIDTH, 2)
    loss = memory.training_step(model, BATCH, WIDTH, device="cpu")()
    assert isinstance(loss, float) and all(p.grad is not None for p in model.parameters())


def test_checkpointed_mlp_computes_the_same():
    torch.manual_seed(0)
    plain = memory.mlp(WIDTH, 3)
    torch.manual_seed(0)
    ckpt = memory.mlp(WIDTH, 3, checkpointed=True)
    x = torch.randn(BATCH, WIDTH)
    torch.testing.assert_close(ckpt(x), plain(x))


def test_checkpointing_variants_give_the_same_gradients():
    x = torch.randn(BATCH, WIDTH)
    grads = {}
    for mode in memory.CHECKPOINTING:
        torch.manual_seed(0)
        model = memory.gated_stack(WIDTH, 2, mode)
        model(x).sum().backward()
        grads[mode] = [p.grad for p in model.parameters()]
    for mode in ("full", "selective"):
        for a, b in zip(grads[mode], grads["none"]):
            torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="checkpointing must be one of none, full, selective"):
        memory.gated_stack(WIDTH, 2, "partial")


def test_selective_checkpointing_saves_the_matmuls_and_recomputes_the_rest():
    from torch.utils.checkpoint import CheckpointPolicy
    assert memory.save_matmuls(None, torch.ops.aten.mm.default) is CheckpointPolicy.MUST_SAVE
    assert memory.save_matmuls(None, torch.ops.aten.addmm.default) is CheckpointPolicy.MUST_SAVE
    assert memory.save_matmuls(None, torch.ops.aten.gelu.default) is CheckpointPolicy.PREFER_RECOMPUTE
    result = memory.checkpoint_comparison(batch=64, width=WIDTH, depth=3, repeats=1, min_run_time=0.01)
    act = result["activation_peak_bytes"]
    assert act["full"] < act["selective"] < act["none"], act
    # per block, hidden = 4 x width: no checkpointing keeps up, gate, gelu(up) and the product;
    # selective keeps the two matmul outputs: 2 hidden tensors less per block, except for the block
    # whose pointwise outputs are being recomputed in backward
    hidden = 4 * 64 * 4 * WIDTH
    assert act["none"] - act["selective"] >= (3 - 1) * 2 * hidden, act
    assert set(result["timing"]["results"]) == set(memory.CHECKPOINTING)


def test_run_fresh_returns_what_the_function_returned_and_reports_failures():
    assert memory.run_fresh("mib", nbytes=3 << 20) == "3.00 MiB"
    with pytest.raises(ValueError, match="helpers.memory has no function 'nope'"):
        memory.run_fresh("nope")
    with pytest.raises(RuntimeError, match="(?s)memory.mib failed in a fresh process .*TypeError"):
        memory.run_fresh("mib", wrong=1)


def test_the_gpu_only_helpers_name_what_this_torch_has():
    """fragmentation_workload and oom_snapshot run in a fresh process, out of reach of the static
    check of the GPU sections (tests/test_gpu_sections.py): the same check, applied to them here."""
    import inspect
    import textwrap
    from test_gpu_sections import ROOTS, problems
    for fn in (memory.fragmentation_workload, memory.oom_snapshot, memory.run_fresh):
        found, _ = problems(textwrap.dedent(inspect.getsource(fn)), {**ROOTS, "torch": torch})
        assert not found, (fn.__name__, found)
    if torch.version.cuda or torch.version.hip:     # a CUDA or ROCm build has the observer hook
        assert callable(torch._C._cuda_attach_out_of_memory_observer)


def test_gpu_only_helpers_fail_clearly_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="memory.fragmentation_workload failed in a fresh process"):
        memory.run_fresh("fragmentation_workload", sizes_mib=[12], tensors_per_step=1)


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


@pytest.mark.requires_cuda
def test_expandable_segments_and_the_oom_observer_on_gpu(tmp_path):
    native = memory.run_fresh("fragmentation_workload")
    expandable = memory.run_fresh("fragmentation_workload", env={"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    assert not native["expandable"] and native["peak_reserved_bytes"] > native["peak_allocated_bytes"]
    if expandable["expandable"]:
        assert expandable["peak_reserved_bytes"] < native["peak_reserved_bytes"]
    oom = memory.run_fresh("oom_snapshot", path=str(tmp_path / "oom.pickle"))
    assert oom["observer_calls"] and "out of memory" in oom["error"].lower()


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


def test_largest_allocations_skip_the_cpp_frames_of_a_real_symbolised_traceback():
    """A stack as torch records it with stacks="all" (the default of _record_memory_history): C++
    frames first ('??:0 torch::unwind::unwind()'), then Python. Gathered and symbolised by torch itself,
    on the CPU."""
    def allocate_here():
        return torch._C._profiler.gather_traceback(True, True, True)
    frames = torch._C._profiler.symbolize_tracebacks([allocate_here()])[0]
    assert not frames[0]["filename"].endswith(".py")          # the C++ frames the old reader took
    snapshot = {"device_traces": [[{"action": "alloc", "size": 1024, "frames": frames}]]}
    where = memory.largest_allocations(snapshot)[0]["where"]
    assert where.startswith(__file__) and where.endswith("in allocate_here"), where


def test_allocated_bytes_rounds_to_the_allocators_blocks_on_a_gpu_only():
    tensors = [torch.empty(1), torch.empty(1000), torch.empty(128)]        # 4, 4000 and 512 bytes
    assert memory.allocated_bytes(tensors, "cpu") == 4516
    assert memory.allocated_bytes(tensors, "cuda") == 512 + 4096 + 512


def test_timeline_device_names_what_the_exporter_takes():
    assert memory.timeline_device("cpu") == "cpu"
    assert memory.timeline_device(torch.device("cuda", 1)) == "cuda:1"


@pytest.mark.requires_cuda
def test_timeline_categories_match_the_model_on_a_gpu():
    """What lesson 07 asserts when it runs on a GPU: exact bytes per category, after the allocator's rounding;
    Adam's step counters stay on the CPU."""
    torch.manual_seed(0)
    model = memory.mlp(WIDTH, 2).cuda()
    step = memory.training_step(model, BATCH, WIDTH, device="cuda")
    step()
    prof = memory.profile_steps(step, steps=1, device="cuda")
    tl = memory.timeline(prof, memory.timeline_device("cuda"))
    params = list(model.parameters())
    assert memory.peak_bytes(tl, "parameter") == memory.allocated_bytes(params, "cuda")
    assert memory.peak_bytes(tl, "optimizer_state") == memory.allocated_bytes(params * 2, "cuda")
    assert memory.top_allocations(prof, 3, device="cuda")
