"""helpers.fusion: compile inspection, the workloads, and the Triton combo kernel.

The kernel runs under Triton's interpreter in a child process: TRITON_INTERPRET=1 must be set before
triton is first imported, and other tests in this process may already have imported it (torch.compile
does)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from helpers import fusion

# --- Pure Python: grid, inputs, reference, parsing -------------------------------------------------

@pytest.mark.parametrize("numels, block, expected", [
    ([1000, 1, 3075], 256, (18, [4, 5, 18])),
    ([256, 512, 768], 256, (6, [1, 3, 6])),
    ([0, 5, 0], 4, (2, [0, 2, 2])),
    ([0, 0, 0], 1024, (0, [0, 0, 0])),
    ([], 16, (0, [])),
])
def test_combo_grid(numels, block, expected):
    assert fusion.combo_grid(numels, block) == expected


def test_combo_grid_rejects_bad_input():
    with pytest.raises(ValueError, match="block must be >= 1"):
        fusion.combo_grid([4], 0)
    with pytest.raises(ValueError, match="numels must be >= 0"):
        fusion.combo_grid([4, -1], 4)


@pytest.mark.parametrize("numels, block, expected", [
    ([1000, 1, 3075], 256, (39, 21)),      # 13 blocks each for 3 parts; 4 + 1 + 13 have work
    ([256, 512, 768], 256, (9, 3)),
    ([0, 0, 0], 1024, (0, 0)),
    ([], 16, (0, 0)),
])
def test_round_robin_grid(numels, block, expected):
    assert fusion.round_robin_grid(numels, block) == expected


def test_combo_groups_are_chunks_of_eight():
    assert [len(g) for g in fusion.combo_groups(range(30))] == [8, 8, 8, 6]
    assert fusion.combo_groups([5, 6, 7], max_nodes=2) == [[5, 6], [7]]
    with pytest.raises(ValueError, match="max_nodes"):
        fusion.combo_groups([1], max_nodes=0)


@pytest.mark.parametrize("numels, mixed, expected", [
    ([1024 + 37 * i for i in range(8)], True, "round_robin"),    # utilization 0.90
    ([256 + 37 * i for i in range(6)], True, "sequential"),      # 0.79: just under the 0.8 bar
    ([1024 + 37 * i for i in range(8)], False, "sequential"),    # foreach kernels: no mixed sizes
    ([1000, 1, 3075], True, "sequential"),
    ([512, 512], True, "round_robin"),
    ([-4, 4], True, "round_robin"),                              # negative: a no-x-dim kernel's block count
])
def test_dispatch_strategy_matches_the_installed_inductor(numels, mixed, expected):
    assert fusion.combo_dispatch_strategy(numels, mixed_sizes=mixed) == expected
    assert fusion.inductor_combo_dispatch_strategy(numels, mixed_sizes=mixed) == expected


def test_dispatch_strategy_rejects_no_sizes():
    with pytest.raises(ValueError, match="at least one"):
        fusion.combo_dispatch_strategy([])


def test_inductor_options_reads_the_installed_config():
    got = fusion.inductor_options("combo_kernels", "combo_kernel_max_num_args", "cpp.max_horizontal_fusion_size",
                                  "no_such_option")
    assert got["combo_kernels"] is False and got["no_such_option"] is None
    assert isinstance(got["combo_kernel_max_num_args"], int) and got["cpp.max_horizontal_fusion_size"] > 0


def test_torch_optim_sgd_matches_the_hand_written_step():
    for foreach in (False, True):
        ref = fusion.make_sgd_state(4, 16, seed=3)
        opt, params = fusion.sgd_optimizer(ref[0], ref[1], foreach=foreach)
        for _ in range(3):
            fusion.sgd_step(*ref)
            opt.step()
        for p, r in zip(params, ref[0]):
            torch.testing.assert_close(p.detach(), r, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        fusion.sgd_optimizer(ref[0], ref[1][:2], foreach=True)


def test_combo_reference_matches_the_definition():
    xs = [torch.randn(7), torch.randn(3, 5), torch.randn(0)]
    got = fusion.combo_reference(xs, alpha=0.25)
    torch.testing.assert_close(got[0], xs[0] * 0.25)
    torch.testing.assert_close(got[1], xs[1].clamp(min=0))
    assert got[2].shape == (0,)
    half = [torch.randn(9).half() for _ in range(3)]
    out = fusion.combo_reference(half)
    assert [o.dtype for o in out] == [torch.float16] * 3
    torch.testing.assert_close(out[2].float(), torch.nn.functional.silu(half[2].float()), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("xs, error, match", [
    ([torch.randn(4)] * 2, ValueError, "exactly 3 tensors"),
    ([torch.randn(4), torch.randn(4), [1.0]], ValueError, "item 2 is a list, not a tensor"),
    ([torch.randn(4), torch.arange(4), torch.randn(4)], TypeError, "tensor 1 has dtype torch.int64"),
    ([torch.randn(4), torch.randn(4), torch.randn(4, dtype=torch.float64)], TypeError, "float32, float16 or bfloat16"),
    ([torch.randn(4), torch.randn(4), torch.randn(4, device="meta")], ValueError, "one device"),
])
def test_combo_inputs_are_validated(xs, error, match):
    with pytest.raises(error, match=match):
        fusion.combo_reference(xs)
    with pytest.raises(error, match=match):
        fusion.combo_launch(xs)        # validated before Triton is touched
    with pytest.raises(error, match=match):
        fusion.combo_launch_round_robin(xs)


def test_combo_launch_rejects_a_block_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        fusion.combo_launch([torch.randn(4)] * 3, block=100)


SAMPLE_CODE = '''
cpp_fused_mul_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r\'\'\'
extern "C" void kernel(const float* in_ptr0, float* out_ptr0) {}
\'\'\')
triton_poi_fused_sin_1 = async_compile.triton('triton_poi_fused_sin_1', \'\'\'
def triton_poi_fused_sin_1(in_ptr0, out_ptr0): pass
\'\'\')
def call(args):
    cpp_fused_mul_0(arg0_1, buf0)
    extern_kernels.mm(buf0, arg1_1, out=buf1)
    triton_poi_fused_sin_1.run(buf1, buf2)
'''


def test_generated_code_parsing():
    assert fusion.kernel_functions(SAMPLE_CODE) == ["cpp_fused_mul_0", "triton_poi_fused_sin_1"]
    assert fusion.wrapper_calls(SAMPLE_CODE) == ["cpp_fused_mul_0(arg0_1, buf0)",
                                                 "extern_kernels.mm(buf0, arg1_1, out=buf1)",
                                                 "triton_poi_fused_sin_1.run(buf1, buf2)"]
    assert fusion.kernel_source(SAMPLE_CODE, "cpp_fused_mul_0").splitlines()[1].startswith('extern "C"')
    assert len(fusion.kernel_source(SAMPLE_CODE, "cpp_fused_mul_0", max_lines=1).splitlines()) == 2
    with pytest.raises(KeyError, match="no kernel named 'nope'"):
        fusion.kernel_source(SAMPLE_CODE, "nope")


TRITON_SAMPLE = """
triton_poi_fused_0 = async_compile.triton('triton_poi_fused_0', '''
@triton.jit
def triton_poi_fused_0(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xnumel = 1000
''', device_str='cuda')
triton_poi_fused_1 = async_compile.triton('triton_poi_fused_1', '''
def triton_poi_fused_1(in_ptr0): pass
''', device_str='cuda')
"""


def test_kernel_source_reads_a_triton_kernel_to_its_end():
    source = fusion.kernel_source(TRITON_SAMPLE, "triton_poi_fused_0")
    assert source.splitlines()[-1] == "''', device_str='cuda')"
    assert "triton_poi_fused_1(" not in source and "xnumel = 1000" in source


# --- Inductor's own tools: TORCH_LOGS, TORCH_COMPILE_DEBUG ----------------------------------------

LOG_SAMPLE = """\
V1202 08:19:29.462000 4639 torch/_inductor/scheduler.py:4995] [0/0] [__fusion] ===== attempting fusion (1/10): 2 nodes =====
V1202 08:19:29.463000 4639 torch/_inductor/scheduler.py:6452] [0/0] [__fusion] found 0 possible fusions
W1202 08:19:30.000000 4639 torch/_inductor/debug.py:545] [0/0] model__0_inference_0 debug trace: /tmp/x
V1202 08:19:41.268000 4639 .venv/lib/python3.11/site-packages/torch/_inductor/graph.py:2722] [0/0] [__output_code] Output code:
V1202 08:19:41.268000 4639 torch/_inductor/graph.py:2722] [0/0] [__output_code]     cpp_fused_cos_sin_0(arg0_1, buf0)
V1202 08:19:41.268000 4639 torch/_inductor/graph.py:2722] [__recompiles] Recompiling function step
"""


def test_torch_log_lines_cut_the_prefix_and_keep_one_artifact():
    assert fusion.torch_log_lines(LOG_SAMPLE, "fusion") == ["===== attempting fusion (1/10): 2 nodes =====",
                                                            "found 0 possible fusions"]
    assert fusion.torch_log_lines(LOG_SAMPLE, "output_code") == ["Output code:", "    cpp_fused_cos_sin_0(arg0_1, buf0)"]
    assert fusion.torch_log_lines(LOG_SAMPLE, "recompiles") == ["Recompiling function step"]
    assert fusion.torch_log_lines("plain text\n", "fusion") == []


IR_SAMPLE = """\
op0: SchedulerNode(ComputedBuffer)
op0.writes = [MemoryDep('buf0', c0, {c0: 4096})]
class op0_loop_body:
    var_ranges = {p0: 4096}


op1_op2: FusedSchedulerNode(SchedulerNode,SchedulerNode)
op1_op2.writes = [MemoryDep('buf1', c0, {c0: 4096}), MemoryDep('buf2', c0, {c0: 4096})]
op1_op2.snodes[0] =
op1: SchedulerNode(ComputedBuffer)
op1.writes = [MemoryDep('buf1', c0, {c0: 4096})]
op1_op2.snodes[1] =
op2: SchedulerNode(ComputedBuffer)
"""


def test_scheduler_nodes_lists_the_top_level_nodes():
    assert fusion.scheduler_nodes(IR_SAMPLE) == ["op0: SchedulerNode", "op1_op2: FusedSchedulerNode"]
    assert fusion.scheduler_nodes("") == []


def test_debug_trace_file_says_why_nothing_was_written(tmp_path):
    with pytest.raises(FileNotFoundError, match="fx_graph_cache"):
        fusion.debug_trace_file(tmp_path, "ir_post_fusion.txt")
    (tmp_path / "torchinductor" / "model__0_inference_0.0").mkdir(parents=True)
    (tmp_path / "torchinductor" / "model__0_inference_0.0" / "ir_post_fusion.txt").write_text("op0: SchedulerNode(x)")
    assert fusion.debug_trace_file(tmp_path, "ir_post_fusion.txt") == "op0: SchedulerNode(x)"


def test_the_lesson_tools_on_a_real_compile(tmp_path):
    """What lesson 02 runs: TORCH_LOGS="output_code,fusion" and the debug trace, with the FX graph cache off."""
    import contextlib
    import io

    def mixed(x, y):
        return (x * 2 + 1).relu(), y.sin(), y.cos()
    x, y = torch.randn(100), torch.randn(100)
    log = io.StringIO()
    try:
        with contextlib.redirect_stderr(log):
            torch._logging.set_logs(output_code=True, fusion=True)
            out = torch.compile(mixed, options={"fx_graph_cache": False, "trace.enabled": True,
                                                "trace.debug_dir": str(tmp_path)})(x, y)
    finally:
        torch._logging.set_logs()
    for got, want in zip(out, mixed(x, y)):
        torch.testing.assert_close(got, want)
    assert any("fusion" in line for line in fusion.torch_log_lines(log.getvalue(), "fusion"))
    code = "\n".join(fusion.torch_log_lines(log.getvalue(), "output_code"))
    assert len(fusion.kernel_functions(code)) == 1
    assert len(fusion.scheduler_nodes(fusion.debug_trace_file(tmp_path, "ir_pre_fusion.txt"))) == 3
    post = fusion.scheduler_nodes(fusion.debug_trace_file(tmp_path, "ir_post_fusion.txt"))
    assert len(post) == 2 and any("FusedSchedulerNode" in node for node in post)


# --- Combo kernels: the dispatch Inductor writes, and reading it back --------------------------------

def test_combo_utilization():
    assert fusion.combo_utilization([4096, 4096, 4096, 512]) == pytest.approx(0.78125)
    assert fusion.combo_utilization([-4, 4]) == 1.0
    with pytest.raises(ValueError, match="non-empty"):
        fusion.combo_utilization([0, 0])


@pytest.mark.parametrize("numels, scheme", [([1024 + 37 * i for i in range(8)], "round_robin"),
                                            ([256 + 37 * i for i in range(6)], "sequential"),
                                            ([4096, 4096, 4096, 512], "sequential"),
                                            ([4096, 4096, 4096, 1024], "round_robin")])
def test_inductor_dispatch_code_reads_back_as_its_scheme(numels, scheme):
    code = fusion.inductor_dispatch_code(numels)
    assert fusion.inductor_combo_dispatch_strategy(numels) == scheme
    body = "\n".join("    " + line for line in code.splitlines())
    generated = f"k = async_compile.triton('k', '''\ndef k(XBLOCK: tl.constexpr):\n{body}\n''', device_str='cuda')\n"
    found = fusion.combo_dispatches(generated)
    assert [(d.name, d.scheme, d.numels) for d in found] == [("k", scheme, numels)]
    marker = f"if pid % {len(numels)} == 0:" if scheme == "round_robin" else "if pid < num_xblocks_0:"
    assert marker in code
    short = fusion.inductor_dispatch_code(numels, show=2)
    assert short.count("xnumel = ") == 2 and f"sub-kernels 2 to {len(numels) - 1}" in short
    with pytest.raises(ValueError, match="positive"):
        fusion.inductor_dispatch_code([4, 0])


def test_combo_dispatches_ignores_plain_kernels_and_knows_the_flattened_grid():
    assert fusion.combo_dispatches(TRITON_SAMPLE) == []
    flat = ("k = async_compile.triton('k', '''\n    pid = tl.program_id(0)\n    num_blocks_0 = x_blocks_0\n"
            "    if pid < num_blocks_0:\n        local_pid = pid\n        xnumel = 64\n''', device_str='cuda')\n")
    assert fusion.combo_dispatches(flat)[0].scheme == "sequential_flatten"


def test_per_subkernel_blocks_follow_the_installed_inductor():
    from torch._inductor.codegen.triton_combo_kernel import ComboKernel
    got = fusion.inductor_combo_dispatch_strategy([512, 512], per_subkernel_blocks=True)
    if hasattr(ComboKernel, "SequentialFlattenGridDispatch"):      # after 2.10 (pytorch#172527)
        assert got == "sequential_flatten"
    else:
        assert got == "round_robin"
    assert fusion.inductor_combo_dispatch_strategy([512, 512], mixed_sizes=False) == "sequential"


def test_combo_options_exist_in_inductor_config():
    import torch._inductor.config as config
    for name in (*fusion.COMBO_ON, *fusion.COMBO_OFF, "combo_kernels_autotune", "combo_kernel_allow_mixed_sizes",
                 "combo_kernel_max_num_args"):
        assert hasattr(config, name), name
    # lesson 02: at most 8 kernels per combo kernel, hard-coded in 2.10's scheduler, an option later
    import inspect

    import torch._inductor.scheduler as scheduler
    assert getattr(config, "combo_kernel_max_num_nodes", None) == 8 or "max_num_nodes = 8" in inspect.getsource(scheduler)
    assert hasattr(config.cpp, "max_horizontal_fusion_size")
    assert config.combo_kernels is False, "combo kernels are off by default"
    assert fusion.COMBO_ON["benchmark_combo_kernel"] is False and fusion.COMBO_OFF["benchmark_combo_kernel"] is False


def test_fit_line_and_its_errors():
    fixed, slope = fusion.fit_line([1, 2, 3], [5.0, 7.0, 9.0])
    assert fixed == pytest.approx(3.0) and slope == pytest.approx(2.0)
    with pytest.raises(ValueError, match="at least 2 points"):
        fusion.fit_line([1], [1.0])
    with pytest.raises(ValueError, match="two different x"):
        fusion.fit_line([2, 2], [1.0, 3.0])


def test_sgd_loop_and_foreach_agree():
    ref, fe = fusion.make_sgd_state(5, 33, seed=3), fusion.make_sgd_state(5, 33, seed=3)
    assert [p.numel() for p in ref[0]] == [33, 70, 107, 144, 181]
    for _ in range(2):
        fusion.sgd_step(*ref)
        fusion.sgd_step_foreach(*fe)
    for got_list, ref_list in zip(fe, ref):
        for g, r in zip(got_list, ref_list):
            torch.testing.assert_close(g, r)
    assert any(b.abs().sum() > 0 for b in ref[2]), "momentum buffers were updated"
    with pytest.raises(ValueError, match="n_tensors and base_size must be >= 1"):
        fusion.make_sgd_state(0)


def test_tiny_ops_sweep_rejects_bad_counts():
    for counts in ([], [0, 4]):
        with pytest.raises(ValueError, match="non-empty list of positive ints"):
            fusion.tiny_ops_sweep(counts)


def test_tiny_ops_sweep_fits_the_fastest_repeats(monkeypatch):
    """The lines are fitted on each point's fastest repeat, so one disturbed median does not bend them."""
    def fake_compare(candidates, **kwargs):
        n = fake_compare.n.pop(0)
        return {"results": {name: {"median_s": 1.0 if n == 1 else 2.0 + n,      # a disturbed median at n = 1
                                   "min_s": 3.0 + 2.0 * n, "max_s": 4.0 + 2.0 * n} for name in candidates}}
    fake_compare.n = [1, 4, 16]
    monkeypatch.setattr(fusion, "compare", fake_compare)
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    sweep = fusion.tiny_ops_sweep([1, 4, 16])
    assert sweep["min_s"]["compiled chain"] == [5.0, 11.0, 35.0]
    assert sweep["median_s"]["eager chain"] == [1.0, 6.0, 18.0]
    assert sweep["max_s"]["eager independent"] == [6.0, 12.0, 36.0]
    for fit in sweep["fit"].values():
        assert fit["fixed_s"] == pytest.approx(3.0) and fit["per_op_s"] == pytest.approx(2.0)


def test_chain_and_independent_ops():
    x = torch.ones(4)
    torch.testing.assert_close(fusion.chain_ops(x, 3), torch.full((4,), 1.0001 ** 3))
    ts = [torch.zeros(2), torch.zeros(3)]
    fusion.independent_ops(ts)
    assert all(torch.equal(t, torch.ones_like(t)) for t in ts)


# --- torch.compile on the CPU (a few small compiles) ----------------------------------------------

def test_inspect_compiled_cpu_chain_is_one_function_one_loop():
    x = torch.randn(100)
    info = fusion.inspect_compiled(fusion.chain_ops, x, 4)
    torch.testing.assert_close(info.result, fusion.chain_ops(x, 4))
    assert len(info.kernel_functions) == 1 and info.kernel_functions[0].startswith("cpp_fused")
    assert info.loop_kernels == 1 and info.extern_calls == []
    torch.testing.assert_close(info.fn(x, 4), fusion.chain_ops(x, 4))


def test_combo_kernels_change_nothing_on_cpu():
    def pair(a, b):
        return a.sin(), b.cos()
    a, b = torch.randn(64), torch.randn(50)
    off = fusion.inspect_compiled(pair, a, b, options=fusion.COMBO_OFF)
    on = fusion.inspect_compiled(pair, a, b, options=fusion.COMBO_ON)
    assert on.kernel_functions == off.kernel_functions and len(on.kernel_functions) == 1
    assert on.loop_kernels == off.loop_kernels == 2
    assert fusion.kernel_source(on.code, on.kernel_functions[0]) == fusion.kernel_source(off.code, off.kernel_functions[0])


def test_compiled_sgd_step_matches_eager_and_is_one_function():
    ref, co = fusion.make_sgd_state(3, 40, seed=5), fusion.make_sgd_state(3, 40, seed=5)
    fusion.sgd_step(*ref)
    info = fusion.inspect_compiled(fusion.sgd_step, *co)
    for got_list, ref_list in zip(co, ref):
        for g, r in zip(got_list, ref_list):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    assert len(info.kernel_functions) == 1 and info.loop_kernels == 3


def test_inspect_compiled_errors():
    with pytest.raises(TypeError, match="needs a function"):
        fusion.inspect_compiled(42)
    with pytest.raises(RuntimeError, match="Unexpected optimization option combo_kernel"):
        fusion.inspect_compiled(fusion.chain_ops, torch.ones(2), 1, options={"combo_kernel": True})


# --- The Triton kernel under the interpreter (child process) --------------------------------------

INTERPRETER_SCRIPT = textwrap.dedent("""
    import json, os
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    from helpers import fusion
    torch.manual_seed(0)
    results = {"interpreted": fusion.kernels_interpreted()}
    cases = [([1000, 1, 3075], "float32", 256), ([0, 513, 2], "float32", 256), ([0, 0, 0], "float32", 1024),
             ([1, 1, 1], "float32", 16), ([4096, 4095, 4097], "float32", 1024), ([777, 64, 1025], "float16", 256),
             ([300, 5, 70], "bfloat16", 128)]
    for sizes, dtype, block in cases:
        xs = [torch.randn(n).to(getattr(torch, dtype)) for n in sizes]
        xs[2] = xs[2] * 8                              # reach silu's saturated tails too
        want = fusion.combo_reference(xs, alpha=-1.5)
        for kind, fn in (("combo", fusion.combo_launch), ("separate", fusion.separate_launches),
                         ("round_robin", fusion.combo_launch_round_robin)):
            got = fn(xs, alpha=-1.5, block=block)
            results[f"{kind} {sizes} {dtype}"] = [
                [list(g.shape) == list(w.shape), str(g.dtype) == str(w.dtype),
                 (g.float() - w.float()).abs().max().item() if g.numel() else 0.0] for g, w in zip(got, want)]
    x2d = [torch.randn(3, 5), torch.randn(2, 2).t(), torch.randn(7)]   # non-contiguous input too
    got = fusion.combo_launch(x2d, alpha=2.0, block=16)
    results["shapes"] = [list(g.shape) for g in got]
    results["2d max error"] = max((g - w).abs().max().item() for g, w in zip(got, fusion.combo_reference(x2d, 2.0)))
    print("RESULTS" + json.dumps(results))
""")


@pytest.fixture(scope="module")
def interpreter_results():
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", INTERPRETER_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULTS"))
    return json.loads(line[len("RESULTS"):])


@pytest.mark.requires("triton")
def test_kernels_run_interpreted_in_the_child(interpreter_results):
    assert interpreter_results["interpreted"] is True


@pytest.mark.requires("triton")
@pytest.mark.parametrize("kind", ["combo", "separate", "round_robin"])
def test_triton_kernel_matches_eager_under_the_interpreter(interpreter_results, kind):
    cases = {k: v for k, v in interpreter_results.items() if k.startswith(kind + " ")}
    assert len(cases) == 7
    for name, parts in cases.items():
        tol = {"float32": 1e-5, "float16": 2e-2, "bfloat16": 1e-1}[name.rsplit(" ", 1)[1]]
        for part, (same_shape, same_dtype, err) in enumerate(parts):
            assert same_shape and same_dtype, f"{name} part {part}"
            assert err <= tol, f"{name} part {part}: max error {err}"


@pytest.mark.requires("triton")
def test_triton_kernel_keeps_shapes_and_handles_non_contiguous_input(interpreter_results):
    assert interpreter_results["shapes"] == [[3, 5], [2, 2], [7]]
    assert interpreter_results["2d max error"] <= 1e-5


@pytest.mark.requires("triton")
def test_cpu_tensors_without_the_interpreter_get_a_clear_error():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process runs Triton interpreted")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        fusion.combo_launch([torch.randn(4)] * 3)


# --- GPU ---------------------------------------------------------------------------------------

@pytest.mark.requires("triton_gpu")
def test_triton_kernel_on_the_gpu():
    from helpers.device import pick_device
    device = pick_device()
    xs = [torch.randn(n, device=device) for n in (1000, 1, 3075)]
    for got, want in zip(fusion.combo_launch(xs, alpha=0.5), fusion.combo_reference(xs, alpha=0.5)):
        torch.testing.assert_close(got, want)


@pytest.mark.requires("triton_gpu")
def test_combo_kernels_do_not_add_kernels_on_the_gpu():
    from helpers.device import pick_device
    state = lambda: fusion.make_sgd_state(12, 256, device=pick_device())
    off = fusion.inspect_compiled(fusion.sgd_step, *state(), options=fusion.COMBO_OFF)
    on = fusion.inspect_compiled(fusion.sgd_step, *state(), options=fusion.COMBO_ON)
    assert 1 <= len(on.kernel_functions) <= len(off.kernel_functions)
