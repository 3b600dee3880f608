"""helpers.data: every property of thread_map, the transforms, and the loaders the lesson compares."""
import subprocess
import sys
import sysconfig
import threading
import time

import pytest
import torch

from helpers import bench, data
from helpers.data import TransformError, live_workers, serial_map, thread_map


@pytest.fixture(autouse=True)
def no_leaked_threads():
    before = {t.ident for t in threading.enumerate()}
    assert live_workers() == 0
    yield
    assert live_workers() == 0, "thread_map joins its workers before it returns or raises"
    deadline = time.monotonic() + 2    # torchdata's threads notice the end within its 0.1 s queue poll
    while (leaked := [t.name for t in threading.enumerate() if t.ident not in before]) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert not leaked, f"threads left running: {leaked}"


def square(x):
    return x * x


@pytest.mark.parametrize("workers,prefetch", [(1, 1), (3, None), (4, 2), (2, 7)])
@pytest.mark.parametrize("n", [0, 1, 13])
def test_ordered_matches_serial(workers, prefetch, n):
    assert list(thread_map(square, range(n), workers=workers, prefetch=prefetch)) == [i * i for i in range(n)]


def blocks_item_0_until_item_3():
    released = threading.Event()

    def fn(i):
        if i == 0:
            assert released.wait(5), "item 3 never ran"
        if i == 3:
            released.set()
        return i
    return fn


def test_unordered_yields_in_completion_order():
    out = list(thread_map(blocks_item_0_until_item_3(), range(6), workers=2, ordered=False))
    assert sorted(out) == list(range(6))
    assert out[0] != 0, "item 0 waits for item 3, so unordered it cannot come first"
    assert list(thread_map(blocks_item_0_until_item_3(), range(6), workers=2)) == list(range(6))


@pytest.mark.parametrize("prefetch", [1, 3])
def test_prefetch_bounds_items_taken_ahead(prefetch):
    pulled = []

    def source():
        for i in range(100):
            pulled.append(i)
            yield i

    it = thread_map(square, source(), workers=2, prefetch=prefetch)
    assert next(it) == 0
    time.sleep(0.05)                     # workers are idle now; nothing more may be pulled
    assert len(pulled) == prefetch
    assert next(it) == 1
    assert len(pulled) <= prefetch + 1
    it.close()


def test_seeded_results_do_not_depend_on_threads():
    images = data.make_images(9, side=40)
    reference = serial_map(data.augment_image, images, seed=7)
    for workers in (1, 4):
        for _ in range(2):
            out = list(thread_map(data.augment_image, images, workers=workers, seed=7))
            assert all(torch.equal(a, b) for a, b in zip(out, reference, strict=True))
    other = serial_map(data.augment_image, images, seed=8)
    assert not all(torch.equal(a, b) for a, b in zip(other, reference))


def test_item_seed_is_a_function_of_seed_and_index():
    assert data.item_seed(0, 5) == data.item_seed(0, 5)
    seeds = {data.item_seed(s, i) for s in range(4) for i in range(100)}
    assert len(seeds) == 400 and all(0 <= s < 2**63 for s in seeds)


def fails_on_five(i):
    if i == 5:
        raise KeyError("bad record")
    return i


@pytest.mark.parametrize("workers", [1, 3])
def test_error_names_the_item_and_keeps_the_cause(workers):
    got = []
    with pytest.raises(TransformError, match=r"item 5: KeyError: 'bad record'") as info:
        for x in thread_map(fails_on_five, range(20), workers=workers):
            got.append(x)
    assert info.value.index == 5
    assert isinstance(info.value.__cause__, KeyError)
    assert got == [0, 1, 2, 3, 4], "ordered: every item before the failing one is delivered first"
    assert live_workers() == 0


def test_error_unordered_and_seeded():
    with pytest.raises(TransformError) as info:
        list(thread_map(lambda x, rng: fails_on_five(x), range(10), workers=2, ordered=False, seed=0))
    assert info.value.index == 5


def test_failing_input_iterable_stops_workers():
    def source():
        yield 1
        yield 2
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(thread_map(square, source(), workers=3))
    assert live_workers() == 0


def test_abandoned_iterator_joins_workers():
    before = len(threading.enumerate())
    it = thread_map(square, range(1000), workers=4)
    assert [next(it) for _ in range(3)] == [0, 1, 4]
    assert live_workers() == 4 and len(threading.enumerate()) == before + 4
    it.close()
    assert live_workers() == 0 and len(threading.enumerate()) == before


def test_break_out_of_loop_joins_workers():
    before = len(threading.enumerate())
    for x in thread_map(square, range(1000), workers=3):
        if x > 10:
            break
    assert len(threading.enumerate()) == before


def test_no_threads_before_first_item():
    it = thread_map(square, range(5), workers=3)
    assert live_workers() == 0
    it.close()


@pytest.mark.parametrize("kwargs,match", [
    ({"workers": 0}, "workers must be an int >= 1"),
    ({"workers": 2.0}, "workers must be an int >= 1"),
    ({"prefetch": 0}, "prefetch must be an int >= 1"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        thread_map(square, range(3), **kwargs)


def test_not_callable():
    with pytest.raises(TypeError, match="fn must be callable"):
        thread_map(42, range(3))


def fnv1a_reference(word: str) -> int:
    h = 0xCBF29CE484222325
    for byte in word.encode():
        h = ((h ^ byte) * 0x100000001B3) % 2**64
    return h % data.VOCAB


@pytest.mark.parametrize("text,words", [
    ("", []), ("  ,;!", []), ("Hello, world", ["hello", "world"]), ("a", ["a"]),
    ("don't STOP-me now", ["don", "t", "stop", "me", "now"]),
])
def test_tokenize_matches_fnv1a(text, words):
    assert data.tokenize(text) == [fnv1a_reference(w) for w in words]


def test_make_texts_deterministic():
    a, b = data.make_texts(3, words=20), data.make_texts(3, words=20)
    assert a == b and len(a) == 3 and all(len(t.split()) == 20 for t in a)


def test_augment_image_shape_and_constant_image():
    img = torch.full((3, 33, 50), 200, dtype=torch.uint8)
    out = data.augment_image(img, torch.Generator().manual_seed(0), size=24)
    assert out.shape == (3, 24, 24) and out.dtype == torch.float32
    expected = ((torch.full((3, 1, 1), 200 / 255) - data.MEAN) / data.STD).expand(3, 24, 24)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_augment_image_flip_and_crop_follow_the_generator():
    img = torch.arange(3 * 16 * 16, dtype=torch.int64).remainder(256).to(torch.uint8).reshape(3, 16, 16)
    outs = {tuple(data.augment_image(img, torch.Generator().manual_seed(s), size=8).flatten()[:4].tolist())
            for s in range(12)}
    assert len(outs) > 1, "different seeds must give different crops or flips"
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(data.augment_image(img, g1), data.augment_image(img, g2))


@pytest.mark.parametrize("bad", [torch.zeros(3, 8, 8), torch.zeros(1, 8, 8, dtype=torch.uint8),
                                 torch.zeros(8, 8, dtype=torch.uint8)])
def test_augment_image_rejects_bad_input(bad):
    with pytest.raises(ValueError, match=r"expects a uint8 image of shape \(3, H, W\)"):
        data.augment_image(bad)


def test_dataloader_matches_serial():
    texts = data.make_texts(5, words=30)
    expected = [data.tokenize(t) for t in texts]
    dl = data.dataloader(data.tokenize, texts, 1)
    try:
        assert [list(map(int, x)) if torch.is_tensor(x) else x for x in dl] == expected
    finally:
        data.shutdown([dl])


@pytest.mark.requires("torchdata")
def test_torchdata_matches_serial():
    texts = data.make_texts(5, words=30)
    assert list(data.nodes_loader(data.tokenize, texts, 2)) == [data.tokenize(t) for t in texts]


def test_collate_stacks_tensors_and_pads_token_lists():
    a, b = torch.zeros(2, 3), torch.ones(2, 3)
    assert torch.equal(data.collate([a, b]), torch.stack([a, b]))
    padded = data.collate([[1, 2, 3], [4]])
    assert padded.dtype == torch.int64 and padded.tolist() == [[1, 2, 3], [4, data.PAD, data.PAD]]


def test_batched_dataloader_collates_in_the_worker():
    texts = data.make_texts(5, words=30)
    dl = data.dataloader(data.tokenize, texts, 2, batch_size=2)
    try:
        batches = list(dl)
    finally:
        data.shutdown([dl])
    assert [tuple(b.shape) for b in batches] == [(2, 30), (2, 30), (1, 30)]
    assert torch.cat(batches).tolist() == [data.tokenize(t) for t in texts]


def test_worker_counts_are_capped_and_include_oversubscription():
    assert data.worker_counts(64, quick=True) == [1, 2]
    assert data.worker_counts(2, quick=False) == [1, 2, 4]
    assert data.worker_counts(6, quick=False) == [1, 2, 4, 6]
    assert data.worker_counts(64, quick=False) == [1, 2, 4, data.MOST_WORKERS]


@pytest.mark.requires("torchdata")
def test_measure_reports_items_per_second():
    result = data.measure(data.tokenize, data.make_texts(4, words=10), [1, 2], batch_size=2, repeats=1,
                          min_run_time=0.001)
    assert result["worker_counts"] == [1, 2] and result["batch_size"] == 2 and result["items"] == 4
    for k in (1, 2):
        run = result["by_workers"][k]
        assert set(run["results"]) == {"serial", *data.LOADERS} and run["threads"] == 1
        assert all(r["items_per_s"] > 0 for r in run["results"].values())
    assert len(data.items_per_s(result, "threads")) == 2
    assert data.speedup(result, "serial", 2) == 1.0
    table = data.speedup_table(result)
    assert "processes, batched" in table and "(serial items/s)" in table


def timing(median_s, min_s, max_s):
    return {"median_s": median_s, "min_s": min_s, "max_s": max_s}


def test_speedup_table_marks_a_tie_and_the_plot_range_brackets_the_median():
    def run(threads):
        return {"results": {"serial": {**timing(1.0, 0.9, 1.1), "ratio_to_baseline": 1.0, "items_per_s": 4.0},
                            "threads": {**threads, "ratio_to_baseline": 1.0 / threads["median_s"],
                                        "items_per_s": 4 / threads["median_s"]}}}
    result = {"worker_counts": [1, 2], "items": 4,
              "by_workers": {1: run(timing(1.05, 1.0, 1.2)), 2: run(timing(0.5, 0.45, 0.55))}}
    table = data.speedup_table(result)
    assert "~0.95x" in table and " 2.00x" in table and "a tie here" in table
    slowest, fastest = data.items_per_s_range(result, "threads")
    assert slowest == pytest.approx([4 / 1.2, 4 / 0.55]) and fastest == pytest.approx([4 / 1.0, 4 / 0.45])


def test_measure_without_torchdata_leaves_only_its_loader_out():
    result = data.measure(data.tokenize, data.make_texts(2, words=10), [1], repeats=1, min_run_time=0.001,
                          torchdata=False)
    assert set(result["by_workers"][1]["results"]) == {"serial", "threads", "processes, per sample",
                                                       "processes, batched"}


def test_check_same_outputs_names_the_first_differing_item():
    from helpers.checks import CheckFailed
    ref = [torch.zeros(2), torch.ones(2), torch.ones(2)]
    data.check_same_outputs([t.clone() for t in ref], ref, what="same")
    with pytest.raises(CheckFailed, match=r"item 1 differs.*\n   Hint: look here"):
        data.check_same_outputs([torch.zeros(2), torch.zeros(2), torch.ones(2)], ref, what="x", hint="look here")
    with pytest.raises(CheckFailed, match="2 items, expected 3"):
        data.check_same_outputs(ref[:2], ref, what="x")
    with pytest.raises(CheckFailed, match="expected a list, got tuple"):
        data.check_same_outputs(tuple(ref), ref, what="x")
    with pytest.raises(CheckFailed, match=r"item 0 differs .*got Tensor \(2,\) torch.float64"):
        data.check_same_outputs([torch.zeros(2, dtype=torch.float64)] + ref[1:], ref, what="x")


def test_check_thread_safe_catches_a_shared_buffer():
    from helpers.checks import CheckFailed
    images = [torch.full((64, 64), float(i)) for i in range(16)]
    shared = torch.empty(64, 64)

    def racy(x, rng):
        torch.mul(x, 1.0, out=shared)
        time.sleep(0.002)                      # another thread writes the buffer meanwhile
        return shared.clone()

    def safe(x, rng):
        return x * 1.0

    expected = serial_map(safe, images, seed=0)
    data.check_thread_safe(safe, images, expected, seed=0, what="safe")
    with pytest.raises(CheckFailed, match=r"(?s)items differ from the serial reference.*Hint: outputs that change"):
        data.check_thread_safe(racy, images, expected, seed=0, workers=4, what="racy")


def test_closing_joins_workers_when_the_loop_body_raises():
    import contextlib
    with pytest.raises(ZeroDivisionError):
        with contextlib.closing(thread_map(square, range(1000), workers=3)) as it:
            for x in it:
                if x == 9:
                    1 / 0
    assert live_workers() == 0


def test_interpreter_benchmark_describes_and_times_this_interpreter():
    r = data.interpreter_benchmark(n_texts=4, words=50, workers=2, repeats=1)
    assert r["python"] == sys.version.split()[0] and r["free_threaded"] == bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    assert r["torch"] == torch.__version__
    assert r["serial_s"] > 0 and r["threads_s"] > 0 and r["speedup"] == pytest.approx(r["serial_s"] / r["threads_s"])
    for name in ("serial", "threads"):
        spread = r["results"][name]
        assert spread["min_s"] <= spread["median_s"] == r[f"{name}_s"] <= spread["max_s"]


def test_interpreter_benchmark_in_another_python_and_its_failure():
    r = data.interpreter_benchmark_in(sys.executable, n_texts=4, words=50, repeats=1)
    assert r["texts"] == 4 and r["python"] == sys.version.split()[0]
    with pytest.raises(RuntimeError, match="helpers.data failed"):
        data.interpreter_benchmark_in(sys.executable, n_texts="many")


def test_loader_memory_reports_threads_and_each_start_method():
    texts = data.make_texts(4, words=50)
    memory = data.loader_memory(data.tokenize, texts, 1, ("fork",))
    assert set(memory) == {"measure", "before_mb", "threads", "processes (fork)"}
    assert memory["measure"] == data.memory_measure() in ("PSS", "RSS")
    assert memory["before_mb"] > 10 and all(isinstance(memory[k], float) for k in memory if k != "measure")


def test_copy_on_access_reports_the_list_and_the_tensor():
    grown = data.copy_on_access(20_000, chunks=4)
    assert set(grown) == {"list of Python floats", "float64 tensor"} and all(isinstance(v, float) for v in grown.values())


def fake_run(free_threaded, gil, serial_s, threads_s):
    return {"python": "3.14.0" if free_threaded else "3.12.8", "free_threaded": free_threaded, "gil_enabled": gil,
            "torch": "2.10.0", "texts": 8, "words": 50, "workers": 2, "repeats": 1,
            "serial_s": serial_s, "threads_s": threads_s, "speedup": serial_s / threads_s}


def fake_record():
    return {"schema": data.SIDE_BY_SIDE_SCHEMA, "recorded_utc": "2026-12-02 10:00 UTC",
            "machine": {"cpu": "Some CPU", "usable_cpus": 2, "os": "Linux-x86_64"}, "quick": False,
            "settings": {"n_texts": 8, "words": 50, "workers": 2, "repeats": 1},
            "runs": {data.GIL_BUILD: fake_run(False, True, 0.030, 0.032),
                     data.FT_BUILD: fake_run(True, False, 0.045, 0.025),
                     data.FT_GIL_FORCED: fake_run(True, True, 0.045, 0.080)}}


def test_side_by_side_record_is_written_read_back_and_described(tmp_path, monkeypatch):
    record = fake_record()
    path = data.save_side_by_side(record, tmp_path / "a" / "side.json")
    assert path.exists() and data.recorded_side_by_side(path) == record
    monkeypatch.setenv(data.SIDE_BY_SIDE_OUT_ENV, str(tmp_path / "from_env.json"))
    assert data.save_side_by_side(record) == (tmp_path / "from_env.json").resolve()
    assert data.recorded_side_by_side(tmp_path / "missing.json") is None
    line = data.provenance(record)
    assert "2026-12-02 10:00 UTC on Some CPU (2 usable CPUs" in line and "CPython 3.14.0, torch 2.10.0" in line
    lines = data.side_by_side_lines(record)
    assert "1.50x the time" in lines[-2] and "1.20x the speed" in lines[-1]
    assert all("no spread was recorded" in line for line in lines[-2:])
    (tmp_path / "old.json").write_text('{"schema": "other"}')
    with pytest.raises(ValueError, match="schema"):
        data.recorded_side_by_side(tmp_path / "old.json")


def test_side_by_side_lines_give_each_ratio_its_range_and_say_when_it_is_noisy():
    record = fake_record()
    spreads = {data.GIL_BUILD: (timing(0.030, 0.029, 0.031), timing(0.032, 0.031, 0.033)),
               data.FT_BUILD: (timing(0.045, 0.040, 0.050), timing(0.025, 0.020, 0.035)),
               data.FT_GIL_FORCED: (timing(0.045, 0.044, 0.046), timing(0.080, 0.079, 0.081))}
    for name, (serial, threads) in spreads.items():
        record["runs"][name]["results"] = {"serial": serial, "threads": threads}
    lines = data.side_by_side_lines(record)
    assert "1.50x the time (1.29x to 1.72x over the repeats)" in lines[-2]     # apart: no verdict withheld
    assert "1.20x the speed (0.83x to 1.55x over the repeats; " + bench.NOISY in lines[-1]


def test_a_shipped_recorded_run_is_readable():
    record = data.recorded_side_by_side()
    if record is None:
        pytest.skip(f"no recorded run is shipped yet ({data.RECORDED_SIDE_BY_SIDE})")
    assert set(record["runs"]) == {data.GIL_BUILD, data.FT_BUILD, data.FT_GIL_FORCED}
    assert record["runs"][data.FT_BUILD]["free_threaded"] and not record["runs"][data.GIL_BUILD]["free_threaded"]
    data.side_by_side_lines(record)
    data.provenance(record)


def test_side_by_side_pairs_this_gil_build_with_a_free_threaded_one(monkeypatch):
    calls = []

    def other_build(python, env=None, **kwargs):    # a free-threaded Python, faked
        calls.append((python, env))
        return fake_run(True, bool(env), 0.045, 0.080 if env else 0.025)

    monkeypatch.setattr(data, "interpreter_benchmark", lambda **kwargs: fake_run(False, True, 0.030, 0.032))
    monkeypatch.setattr(data, "interpreter_benchmark_in", other_build)
    record = data.side_by_side("/opt/python3.14t", n_texts=8, words=50, workers=2, repeats=1, quick=True)
    assert calls == [("/opt/python3.14t", None), ("/opt/python3.14t", {"PYTHON_GIL": "1"})]
    assert not record["runs"][data.GIL_BUILD]["free_threaded"] and record["runs"][data.FT_BUILD]["free_threaded"]
    assert record["runs"][data.FT_GIL_FORCED]["gil_enabled"] and record["quick"] and record["schema"]
    assert record["machine"]["usable_cpus"] >= 1 and record["recorded_utc"].endswith("UTC")
    data.side_by_side_lines(record)


def test_side_by_side_needs_the_other_kind_of_build():
    with pytest.raises(ValueError, match="same kind of build"):
        data.side_by_side(sys.executable, n_texts=2, words=10, repeats=1)


def test_side_by_side_command_says_what_it_needs(monkeypatch):
    from helpers import device
    monkeypatch.setattr(device, "capabilities", lambda: device.probe())
    monkeypatch.delenv(device.OTHER_PYTHON_ENV, raising=False)
    with pytest.raises(SystemExit, match="LABS_OTHER_PYTHON"):
        data._main(["side-by-side"])


@pytest.mark.requires("cxx")
def test_the_not_gil_safe_extension_builds_and_imports(tmp_path):
    folder = data.build_not_gil_safe_extension(str(tmp_path))
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {folder!r}); "
                           "import not_gil_safe; print(not_gil_safe.answer())"], capture_output=True, text=True)
    assert done.stdout.strip() == "42", done.stderr


@pytest.mark.requires("free_threaded", "cxx")
def test_importing_it_turns_the_gil_back_on_unless_python_gil_is_0(tmp_path):
    folder = data.build_not_gil_safe_extension(str(tmp_path))
    plain = data.gil_after_import(folder)
    assert plain["before"] is False and plain["after"] is True
    assert any("not_gil_safe" in w and "GIL" in w for w in plain["warnings"]), plain["warnings"]
    assert data.gil_after_import(folder, env={"PYTHON_GIL": "0"})["after"] is False
