"""helpers.debugging: DebugMode traces and divergence, anomaly text, recompiles, the gloo job, TorchScript."""
import copy

import pytest
import torch
from torch import nn

from helpers import debugging


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 1))


def test_op_trace_lists_aten_ops(net):
    text = debugging.op_trace(net, torch.randn(2, 8))
    assert text.count("aten::addmm") == 3 and "aten::gelu" in text


def test_identical_runs_do_not_diverge(net):
    x = torch.randn(4, 8)
    for hash_fn in ("norm", "hash_tensor"):
        a, b = debugging.hash_trace(net, x, hash_fn=hash_fn), debugging.hash_trace(net, x, hash_fn=hash_fn)
        assert len(a) == 8 and debugging.first_divergence(a, b) is None


def test_divergence_is_found_at_the_damaged_layer(net):
    x = torch.randn(4, 8)
    bad = copy.deepcopy(net)
    with torch.no_grad():
        bad[2].weight[0, 0] += 1e-3
    d = debugging.first_divergence(debugging.hash_trace(net, x), debugging.hash_trace(bad, x))
    assert d["index"] == 3 and d["op"] == "aten.t.default" and d["rel_diff"] > 0
    loose = debugging.first_divergence(debugging.hash_trace(net, x), debugging.hash_trace(bad, x), rtol=1.0)
    assert loose is None
    diffs = debugging.op_differences(debugging.hash_trace(net, x), debugging.hash_trace(bad, x))
    assert [d["rel_diff"] == 0 for d in diffs[:3]] == [True] * 3 and diffs[3]["rel_diff"] == d["rel_diff"]
    assert diffs[-1]["rel_diff"] > 0 and len(diffs) == 8      # the difference reaches the output


def test_bitwise_hashes_stay_ints_and_see_a_one_ulp_change():
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    y = x.clone()
    y[1] = torch.nextafter(y[1], torch.tensor(5.0, dtype=torch.float64))     # the lowest bit of one element
    a = debugging.hash_trace(torch.clone, x, hash_fn="hash_tensor")
    b = debugging.hash_trace(torch.clone, y, hash_fn="hash_tensor")
    assert all(isinstance(h, int) for _, hashes in a for h in hashes)      # as floats these two would be equal
    assert debugging.first_divergence(a, b)["index"] == 0
    assert all(isinstance(h, float) for _, hashes in debugging.hash_trace(torch.clone, x) for h in hashes)


def test_op_modules_names_the_layer_of_each_op(net):
    x = torch.randn(4, 8)
    modules = debugging.op_modules(net, x)
    ops = [name for name, _ in debugging.hash_trace(net, x)]
    assert len(modules) == len(ops) == 8
    assert list(zip(ops, modules))[3:6] == [("aten.t.default", "2"), ("aten.addmm.default", "2"),
                                            ("aten.gelu.default", "3")]
    assert net(x).shape == (4, 1) and not net._forward_hooks and not net[2]._forward_pre_hooks   # hooks removed


@pytest.mark.parametrize("compare", [debugging.first_divergence, debugging.op_differences])
def test_different_programs_are_refused(net, compare):
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="dispatched different ops"):
        compare(debugging.hash_trace(net, x), debugging.hash_trace(net[:2], x))


def test_backward_error_names_the_function():
    x = torch.tensor([-1.0, 4.0], requires_grad=True)
    with pytest.warns(UserWarning):
        text = debugging.backward_error(lambda: x.sqrt().sum())
    assert text == "Function 'SqrtBackward0' returned nan values in its 0th output."
    with pytest.warns(UserWarning):
        assert debugging.backward_error(lambda: (x * 2).sum()) is None


def test_count_recompiles_reports_the_guard():
    torch._dynamo.reset()
    f = torch.compile(lambda a: a * 3, backend="eager")
    f(torch.randn(4))
    reasons = debugging.count_recompiles(lambda: f(torch.randn(6)))
    assert len(reasons) == 1 and "size mismatch at index 0. expected 4, actual 6" in reasons[0]
    assert debugging.count_recompiles(lambda: f(torch.randn(6))) == []


def test_deterministic_mode_changes_inductor_code():
    args = (torch.zeros(8), torch.tensor([0, 1, 1]), torch.ones(3))
    torch.use_deterministic_algorithms(True)
    try:
        code = debugging.inductor_code(lambda x, i, v: x.index_put((i,), v, accumulate=True), *args)
    finally:
        torch.use_deterministic_algorithms(False)
    assert "aten.index_put_(" in code and "atomic_add" not in code


def test_gloo_job_reports_a_mismatch_with_detail():
    out = debugging.run_gloo_job("mismatched_shapes", timeout_s=3, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert set(out) == {"rank 0", "rank 1"}
    for r in out.values():
        assert r["status"] == "RuntimeError" and "Detected mismatch between collectives on ranks" in r["text"]


def test_gloo_job_rejects_unknown_scenarios():
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        debugging.run_gloo_job("nope")


def test_torchscript_warnings_are_deprecations(tmp_path):
    lines = debugging.torchscript_warnings(nn.Linear(2, 2), torch.randn(1, 2), str(tmp_path / "m.pt"))
    # DeprecationWarning on torch 2.10-2.13, FutureWarning (shown by default) from 2.14
    category = "FutureWarning" if tuple(map(int, torch.__version__.split(".")[:2])) >= (2, 14) else "DeprecationWarning"
    assert f"{category}: `torch.jit.script` is deprecated. Please switch to `torch.compile` or `torch.export`." in lines
    assert f"{category}: `torch.jit.load` is deprecated. Please switch to `torch.export`." in lines
