"""The device layer: real detection on this machine, and every vendor faked through probe()'s arguments."""
import dataclasses
import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from helpers import device
from helpers.device import NEEDS, missing, pick_device, probe, requires, skip_reason


def fake_torch(accelerator=None, hip=None, cuda="12.8", props=None, xpu_compiled=False, with_accelerator_api=True,
               build=None):
    """A stand-in for the torch module with only what probe() reads. `accelerator`: the device present;
    `build`: what the build targets (default: the device present), e.g. build="cuda" with no device is
    PyPI's CUDA wheel on a machine without a GPU, where asking for device properties raises."""
    build = build or accelerator

    def properties(index):
        if accelerator is None:
            raise RuntimeError("Found no NVIDIA driver on your system.")
        return props

    props = props or SimpleNamespace()
    mod = SimpleNamespace(
        __version__="2.10.0",
        version=SimpleNamespace(cuda=None if hip else (cuda if build == "cuda" else None), hip=hip),
        cuda=SimpleNamespace(is_available=lambda: accelerator == "cuda", get_device_properties=properties),
        xpu=SimpleNamespace(is_available=lambda: accelerator == "xpu", get_device_properties=properties,
                            _is_compiled=lambda: xpu_compiled or build == "xpu"),
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: accelerator == "mps")),
    )
    if with_accelerator_api:
        current = SimpleNamespace(type=build) if build else None
        mod.accelerator = SimpleNamespace(current_accelerator=lambda: current, is_available=lambda: accelerator is not None)
    return mod


def fake_sys(gil=True):
    return SimpleNamespace(_is_gil_enabled=lambda: gil)


NO_TOOLS = {"which": lambda name: None, "cpu_flags": {"avx2"}, "config_var": lambda name: None,
            "features": lambda torch_mod: {"fp8_rowwise_cpu": True}, "fp64_runs": lambda torch_mod, dev: True,
            "triton_wanted": lambda: None}


def probe_fake(torch_mod, sys_mod=None, **overrides):
    kwargs = dict(NO_TOOLS, **overrides)
    return probe(torch_mod=torch_mod, sys_mod=sys_mod or fake_sys(), **kwargs)


def test_this_cpu_machine_is_detected_for_real():
    caps = device.capabilities()
    assert caps.torch_version == torch.__version__
    built_for = torch.accelerator.current_accelerator()
    assert caps.accelerator == (caps.accelerator if torch.accelerator.is_available() else "cpu")
    assert (caps.build_accelerator is None) == (built_for is None)
    assert caps.cpu_count >= 1 and caps.python_version.count(".") == 2
    assert caps.gil_enabled == (sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True)
    json.dumps(caps.to_dict())   # the report is JSON-ready
    assert pick_device() == torch.device(caps.device_type)


def test_nvidia_hopper():
    caps = probe_fake(fake_torch("cuda", props=SimpleNamespace(name="NVIDIA H200", total_memory=141 * 2**30,
                                                               major=9, minor=0)))
    assert (caps.accelerator, caps.device_type, caps.arch) == ("cuda", "cuda", "sm_90")
    assert caps.bf16 and caps.fp8 and caps.memory_gb == 141.0 and caps.cuda_version == "12.8"
    assert missing("cuda", "grouped_mm_cutlass", "torch_cuda", "gpu", "fp8", "bf16", caps=caps) == []
    assert device.fp8_dtype("cuda", caps) == torch.float8_e4m3fn
    assert missing("rocm", "xpu", caps=caps) == ["rocm", "xpu"]


def test_nvidia_ampere_has_bf16_but_no_fp8():
    caps = probe_fake(fake_torch("cuda", props=SimpleNamespace(name="A100", total_memory=80 * 2**30,
                                                               major=8, minor=0)))
    assert caps.bf16 and not caps.fp8
    assert missing("grouped_mm_cutlass", "fp8", caps=caps) == ["grouped_mm_cutlass", "fp8"]


def test_colab_free_t4_has_neither_bf16_nor_fp8_and_skips_what_needs_them():
    """Colab's free GPU is a T4 (sm_75): no native bf16, no FP8, no CUTLASS grouped GEMM. The sections that
    need those say so on it; the plain CUDA ones run."""
    from helpers.manifest import entries
    caps = probe_fake(fake_torch("cuda", props=SimpleNamespace(name="Tesla T4", total_memory=15 * 2**30,
                                                               major=7, minor=5)))
    assert (caps.arch, caps.bf16, caps.fp8) == ("sm_75", False, False)
    assert missing("bf16", "fp8", "grouped_mm_cutlass", "cuda", "torch_cuda", caps=caps) == [
        "bf16", "fp8", "grouped_mm_cutlass"]
    sections = {s["name"]: missing(*s["needs"], caps=caps) for i in entries() for s in i["sections"]}
    assert sections["varlen_attn on the GPU"] == ["bf16"] and sections["CUDA graphs on the optimizer step"] == []


@pytest.mark.parametrize("major, minor, cutlass", [(9, 0, True), (10, 0, True), (12, 0, False), (8, 9, False)])
def test_grouped_mm_cutlass_only_where_torch_takes_it(major, minor, cutlass):
    """torch 2.10's _grouped_mm_cuda takes CUTLASS where _scaled_mm_allowed_device(sm90_only, sm100_only)
    holds: compute capability major 9 or 10. An RTX 50xx (sm_120) takes the loop."""
    props = SimpleNamespace(name="gpu", total_memory=2**35, major=major, minor=minor)
    caps = probe_fake(fake_torch("cuda", props=props))
    assert (missing("grouped_mm_cutlass", caps=caps) == []) == cutlass


def test_amd_rocm_mi300():
    props = SimpleNamespace(name="AMD Instinct MI300X", total_memory=192 * 2**30, major=9, minor=4,
                            gcnArchName="gfx942:sramecc+:xnack-")
    caps = probe_fake(fake_torch("cuda", hip="7.1.0", props=props))
    assert (caps.accelerator, caps.device_type, caps.arch) == ("rocm", "cuda", "gfx942")
    assert caps.hip_version == "7.1.0" and caps.cuda_version is None
    assert caps.fp8 and caps.bf16
    assert missing("rocm", "rocm_ck", "gpu", "torch_cuda", caps=caps) == []
    assert device.fp8_dtype("cuda", caps) == torch.float8_e4m3fnuz      # MI300 computes in the fnuz format
    assert device.fp8_dtype("cpu", caps) == torch.float8_e4m3fn
    assert missing("grouped_mm_cutlass", caps=caps) == ["grouped_mm_cutlass"]
    assert missing("cuda", caps=caps) == ["cuda"]


def test_amd_consumer_gpu_has_no_ck_path():
    props = SimpleNamespace(name="Radeon 890M", total_memory=16 * 2**30, major=11, minor=5,
                            gcnArchName="gfx1150")
    caps = probe_fake(fake_torch("cuda", hip="7.1.0", props=props))
    assert caps.arch == "gfx1150" and not caps.fp8
    reason = skip_reason(["rocm_ck"], caps)
    assert "gfx942/gfx950" in reason and "gfx1150" in reason


def test_intel_xpu_and_sycl_toolchain():
    props = SimpleNamespace(name="Intel(R) Data Center GPU Max 1550", total_memory=64 * 2**30)
    tools = {"icpx": "/opt/intel/oneapi/bin/icpx", "ninja": "/usr/bin/ninja"}
    caps = probe_fake(fake_torch("xpu", props=props), which=tools.get)
    assert (caps.accelerator, caps.device_type) == ("xpu", "xpu") and caps.xpu_compiled
    assert missing("xpu", "gpu", "icpx", "sycl", "ninja", caps=caps) == []
    assert missing("cxx", "torch_cuda", "fp8", caps=caps) == ["cxx", "torch_cuda", "fp8"]   # FP8 tried: fake fails
    with_fp8 = probe_fake(fake_torch("xpu", props=props), fp8_runs=lambda torch_mod, dev: dev == "xpu")
    assert with_fp8.fp8 and device.fp8_dtype("xpu", with_fp8) == torch.float8_e4m3fn


def test_sycl_needs_an_xpu_build_too():
    caps = probe_fake(fake_torch(None), which={"icpx": "/usr/bin/icpx"}.get)
    assert missing("icpx", caps=caps) == []
    assert "XPU build of torch" in skip_reason(["sycl"], caps)


@pytest.mark.parametrize("build, hip, name", [("cuda", None, "CUDA"), ("cuda", "7.1.0", "ROCm"), ("xpu", None, "XPU")])
def test_a_gpu_build_without_its_gpu_is_a_cpu_machine(build, hip, name):
    """PyPI's Linux wheel is a CUDA build: on a laptop, a CPU cloud machine or Colab's CPU runtime
    current_accelerator() is cuda, is_available() is False and device properties raise."""
    caps = probe_fake(fake_torch(None, build=build, hip=hip), cpu_flags={"avx512f", "avx512_bf16"})
    assert (caps.accelerator, caps.device_type, caps.arch) == ("cpu", "cpu", "avx512f")
    assert caps.build_accelerator == ("rocm" if hip else build)
    assert caps.bf16 and not caps.fp8 and caps.memory_gb is not None
    assert missing("gpu", "accelerator", "triton_gpu", caps=caps) == ["gpu", "accelerator", "triton_gpu"]
    assert "this machine: cpu" in skip_reason(["gpu"], caps)


def test_doctor_says_what_the_build_is_for():
    from helpers.doctor import build_note
    no_gpu = probe_fake(fake_torch(None, build="cuda"))
    assert "no cuda device is present" in build_note(no_gpu)
    assert build_note(probe_fake(fake_torch(None))) == "CPU only"
    h200 = probe_fake(fake_torch("cuda", props=SimpleNamespace(name="H200", total_memory=2**37, major=9, minor=0)))
    assert build_note(h200) == "cuda (device present)"


def test_version_features_are_tried_on_the_installed_torch():
    features = device.torch_features()
    assert set(features) == set(device.FEATURES) and all(isinstance(v, bool) for v in features.values())
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.float32)
        works = True
    except RuntimeError as exc:
        assert "per-tensor scaling" in str(exc)     # torch 2.10's CPU kernel
        works = False
    assert features["fp8_rowwise_cpu"] == works == (not missing("fp8_rowwise_cpu"))


def test_torch_2_10_without_cpu_rowwise_fp8_says_what_would_run_it():
    caps = probe_fake(fake_torch(None, build="cuda"), features=lambda torch_mod: {"fp8_rowwise_cpu": False})
    reason = skip_reason(["fp8_rowwise_cpu"], caps)
    assert "torch 2.10.0 lacks it" in reason and "newer than 2.10" in reason


def test_a_missing_package_is_named_in_the_skip_reason():
    caps = probe_fake(fake_torch(None))     # NO_TOOLS: no package reads as installed on the fake
    caps = device.dataclasses.replace(caps, packages={"triton": None, "torchao": None, "torchdata": "0.11.0"})
    assert "needs triton_interpreter (triton not installed)" in skip_reason(["triton_interpreter"], caps)
    assert "needs torchao (torchao not installed)" in skip_reason(["torchao"], caps)
    with_triton = device.dataclasses.replace(caps, packages={"triton": "3.6.0"})
    assert "(this machine: cpu" in skip_reason(["triton_gpu"], with_triton)


def test_the_other_build_is_named_by_an_environment_variable(monkeypatch):
    monkeypatch.setenv(device.OTHER_PYTHON_ENV, sys.executable)
    assert probe_fake(fake_torch(None)).other_python == sys.executable
    monkeypatch.setenv(device.OTHER_PYTHON_ENV, "/nowhere/python")
    caps = probe_fake(fake_torch(None))
    assert caps.other_python is None
    assert "LABS_OTHER_PYTHON is /nowhere/python" in skip_reason(["other_python"], caps)


def test_apple_mps():
    caps = probe_fake(fake_torch("mps"))
    assert (caps.accelerator, caps.device_type) == ("mps", "mps")
    assert missing("mps", "accelerator", caps=caps) == [] and missing("gpu", caps=caps) == ["gpu"]


def test_cpu_without_accelerator_api_falls_back_to_per_backend_checks():
    caps = probe_fake(fake_torch(None, with_accelerator_api=False), cpu_flags={"avx512f", "avx512_bf16"})
    assert caps.accelerator == "cpu" and caps.arch == "avx512f" and caps.bf16
    caps = probe_fake(fake_torch("cuda", with_accelerator_api=False,
                                 props=SimpleNamespace(name="T4", total_memory=2**34, major=7, minor=5)))
    assert caps.accelerator == "cuda" and not caps.bf16


def test_free_threaded_python_with_gil_off_and_on():
    caps = probe_fake(fake_torch(None), sys_mod=fake_sys(gil=False), config_var=lambda name: 1)
    assert caps.free_threaded and not caps.gil_enabled
    assert missing("free_threaded", "gil_disabled", caps=caps) == []
    # an extension re-enabled the GIL: free-threaded build, but threads are serialised again
    caps = probe_fake(fake_torch(None), sys_mod=fake_sys(gil=True), config_var=lambda name: 1)
    assert caps.free_threaded and caps.gil_enabled
    reason = skip_reason(["gil_disabled"], caps)
    assert "GIL on: True" in reason and "PYTHON_GIL=0" in reason


def test_old_python_without_is_gil_enabled():
    caps = probe_fake(fake_torch(None), sys_mod=SimpleNamespace())
    assert caps.gil_enabled and not caps.free_threaded


def test_requires_prints_and_records_both_outcomes(tmp_path, monkeypatch, capsys):
    log = tmp_path / "sections.jsonl"
    monkeypatch.setenv(device.SECTION_LOG_ENV, str(log))
    cpu = probe_fake(fake_torch(None), which={"c++": "/usr/bin/c++"}.get)
    assert requires("cxx", section="Build the op", caps=cpu) is True
    assert requires("cuda", "fp8", section="FP8 on the GPU", caps=cpu) is False
    out = capsys.readouterr().out
    assert "▶ Section 'Build the op' runs here" in out
    assert "⏭ SKIPPED section 'FP8 on the GPU': needs cuda" in out and "needs fp8" in out
    assert "environments/cuda.txt" in out      # says what would make it run
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["section"], r["ran"]) for r in records] == [("Build the op", True), ("FP8 on the GPU", False)]
    assert records[1]["reason"].startswith("needs cuda")
    assert device.SECTIONS[-1]["section"] == "FP8 on the GPU"


def test_every_need_has_a_hint_and_is_decidable_on_a_fake_cpu():
    cpu = probe_fake(fake_torch(None))
    for name, (test, hint) in NEEDS.items():
        assert hint, name
        assert isinstance(test(cpu), bool), name


@pytest.mark.parametrize("call, error, text", [
    (lambda: requires("cdua", section="x"), ValueError, "unknown capability 'cdua'"),
    (lambda: requires(section="x"), ValueError, "at least one capability"),
    (lambda: requires("cuda", section=""), ValueError, "section="),
    (lambda: pick_device("cdua"), ValueError, "unknown device 'cdua'"),
    (lambda: missing("gpu", "tpu"), ValueError, "known: "),
])
def test_bad_input_gets_a_clear_error(call, error, text):
    with pytest.raises(error, match=text):
        call()


@pytest.mark.skipif(torch.accelerator.is_available(), reason="this machine has an accelerator")
def test_asking_for_a_missing_device_says_what_to_do():
    with pytest.raises(RuntimeError, match="not available here.*pick_device\\('auto'\\)"):
        pick_device("cuda:0")
    assert pick_device("cpu") == torch.device("cpu")


def test_quick_mode(monkeypatch):
    monkeypatch.delenv(device.QUICK_ENV, raising=False)
    assert device.quick_mode(True) and not device.quick_mode(False)
    monkeypatch.setenv(device.QUICK_ENV, "1")
    assert device.quick_mode(False)


@pytest.mark.requires_cuda
def test_marker_runs_only_on_cuda():
    assert torch.cuda.is_available()


@pytest.mark.requires_gpu
def test_gpu_marker_matmul_on_the_device():
    x = torch.randn(64, 64, device=pick_device())
    torch.testing.assert_close((x @ x).cpu(), x.cpu() @ x.cpu(), rtol=1e-2, atol=1e-2)


def test_learning_path_gives_times_skips_and_what_next_for_the_machine():
    from helpers.doctor import core_lessons_skipping, learning_path
    from helpers.manifest import entries
    cpu = probe_fake(fake_torch(None))
    h200 = probe_fake(fake_torch("cuda", props=SimpleNamespace(name="H200", total_memory=2**37, major=9, minor=0)))
    text = learning_path(cpu)
    for item in entries():
        assert f"{item['minutes']:>3} min  {item['title']}" in text
        for section in item["sections"]:
            assert (f"skips here: {section['name']} (needs " in text) == bool(missing(*section["needs"], caps=cpu))
    assert "Open next: lesson 01" in text and "on a GPU the skipped sections run too" in text
    assert "this GPU runs the GPU sections" in learning_path(h200)
    from helpers.doctor import skipped_here
    cores = [i for i in entries() if i["kind"] == "lesson" and "deep_dive_of" not in i and i["id"] != "00_start_here"]
    for caps in (cpu, h200):
        assert core_lessons_skipping(caps) == [i["id"] for i in cores if skipped_here(i, caps)]
    assert set(core_lessons_skipping(h200)) <= set(core_lessons_skipping(cpu))
    skipped = [{(i["id"], s["name"]) for i in entries() for s in i["sections"] if missing(*s["needs"], caps=caps)}
               for caps in (h200, cpu)]
    assert skipped[0] < skipped[1], "a GPU runs some sections a CPU skips"


def test_usable_cpus_follow_the_affinity_mask_and_the_cgroup_quota(tmp_path):
    quota = tmp_path / "cpu.max"
    unlimited = device.usable_cpus(cpu_max=str(tmp_path / "absent"))
    assert unlimited >= 1
    quota.write_text("150000 100000\n")           # docker --cpus 1.5: two CPUs, rounded up
    assert device.usable_cpus(cpu_max=str(quota)) == min(unlimited, 2)
    quota.write_text("max 100000\n")
    assert device.usable_cpus(cpu_max=str(quota)) == unlimited
    if hasattr(os, "sched_getaffinity"):
        assert unlimited <= len(os.sched_getaffinity(0))


def test_gil_is_read_live_for_this_process_and_from_the_fake_otherwise(monkeypatch):
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    assert device.gil_on() is False, "a live read, not the cached probe"
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)
    assert device.gil_on() is True
    fake = probe_fake(fake_torch(None))
    assert device.gil_on(dataclasses.replace(fake, gil_enabled=False)) is False


# --- Triton under its three distribution names, fp64, the device a sync waits for -----------------

def fake_site(tmp_path, dist: str | None, version="3.6.0"):
    """A site-packages folder with an importable `triton` package installed by `dist` (its dist-info's
    RECORD lists triton/__init__.py), as torch's CUDA (triton), ROCm (triton-rocm) and XPU (triton-xpu)
    wheels install it; dist=None: the module without any distribution."""
    site = tmp_path / "site"
    (site / "triton").mkdir(parents=True)
    (site / "triton" / "__init__.py").write_text("")
    if dist:
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "RECORD").write_text("triton/__init__.py,,\n" + f"{info.name}/METADATA,,\n")
    return site


def finder(site):
    import importlib.machinery
    return lambda name: importlib.machinery.PathFinder.find_spec(name, [str(site)])


@pytest.mark.parametrize("dist", ["triton", "triton-rocm", "triton-xpu", "pytorch-triton-rocm"])
def test_triton_is_found_by_its_module_whatever_distribution_installed_it(tmp_path, dist):
    assert device.triton_install(finder(fake_site(tmp_path, dist))) == ("3.6.0", dist)


def test_no_triton_module_and_a_module_without_distribution(tmp_path):
    assert device.triton_install(lambda name: None) == (None, None)
    assert device.triton_install(finder(fake_site(tmp_path, None))) == ("unknown", None)


def test_torch_s_own_triton_requirement_is_read_without_its_marker():
    cuda = ['filelock', 'triton==3.6.0; platform_system == "Linux" and platform_machine == "x86_64"']
    assert device.torch_triton_requirement(lambda name: cuda) == "triton==3.6.0"
    assert device.torch_triton_requirement(lambda name: ["triton-xpu==3.6.0; platform_system == 'Linux'"]) \
        == "triton-xpu==3.6.0"
    assert device.torch_triton_requirement(lambda name: ["filelock", "sympy>=1.13.3"]) is None


MI300 = SimpleNamespace(name="AMD Instinct MI300X", total_memory=192 * 2**30, major=9, minor=4, gcnArchName="gfx942")
ARC = SimpleNamespace(name="Intel(R) Arc(TM) B580 Graphics", total_memory=12 * 2**30)


@pytest.mark.parametrize("vendor, torch_mod, dist", [
    ("rocm", fake_torch("cuda", hip="7.1.0", props=MI300), "triton-rocm"),
    ("xpu", fake_torch("xpu", props=ARC), "triton-xpu"),
])
def test_rocm_and_xpu_builds_get_their_triton_sections_and_the_vendor_s_remedy(tmp_path, vendor, torch_mod, dist):
    from helpers.doctor import triton_line
    found = device.triton_install(finder(fake_site(tmp_path, dist)))
    caps = probe_fake(torch_mod, triton=lambda: found, triton_wanted=lambda: f"{dist}==3.6.0")
    assert missing("triton", "triton_gpu", caps=caps) == []
    assert requires("triton_gpu", section="Combo kernels on the GPU", caps=caps)
    assert triton_line(caps) == f"3.6.0 from {dist} (torch declares {dist}==3.6.0)"
    # PyPI's generic wheel installed over the vendor's: the doctor says so and what to install instead
    generic = dataclasses.replace(caps, triton_distribution="triton")
    assert f"install '{dist}==3.6.0' from the index your torch came from" in triton_line(generic)
    # no Triton at all: the skip names the vendor's distribution, never PyPI's generic `pip install triton`
    none = dataclasses.replace(caps, packages={**caps.packages, "triton": None}, triton_distribution=None)
    reason = skip_reason(["triton_gpu"], none)
    assert f"pip install '{dist}==3.6.0'" in reason and "pip install triton " not in reason
    bare = dataclasses.replace(none, torch_wants_triton=None)
    assert f"triton-{vendor}" in skip_reason(["triton"], bare) and "not PyPI's generic triton" in skip_reason(["triton"], bare)


def test_a_real_rocm_style_install_is_seen_by_a_fresh_process(tmp_path):
    """The module found first on sys.path, installed as triton-rocm: capabilities() and the doctor of a
    new process (the real find_spec, no fake) report it."""
    import subprocess
    site = fake_site(tmp_path, "triton-rocm", "3.6.0")
    code = ("from helpers.device import capabilities; from helpers.doctor import triton_line; "
            "c = capabilities(); print(c.packages['triton'], c.triton_distribution); print(triton_line(c))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.getcwd()]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "3.6.0 triton-rocm"
    assert "from triton-rocm" in out.stdout


def test_fp64_is_tried_on_the_device_and_references_go_to_the_cpu_without_it():
    arc = probe_fake(fake_torch("xpu", props=ARC), fp64_runs=lambda torch_mod, dev: dev == "cpu")
    assert missing("fp64", caps=arc) == ["fp64"] and "Arc" in skip_reason(["fp64"], arc)
    assert device.reference_device("xpu", arc) == torch.device("cpu")
    assert device.reference_device("cpu", arc) == torch.device("cpu")
    max_gpu = probe_fake(fake_torch("xpu", props=ARC))
    assert device.reference_device("xpu:0", max_gpu) == torch.device("xpu:0")

    class NoFp64:                   # what an Arc GPU answers to a float64 op
        float64 = torch.float64

        @staticmethod
        def ones(*args, **kwargs):
            raise RuntimeError("Required aspect fp64 is not supported on the device")
    assert device._fp64_runs(NoFp64, "xpu") is False
    assert device._fp64_runs(torch, "cpu") is True and device.capabilities().fp64


def test_validation_norms_are_computed_where_float64_exists(monkeypatch):
    from helpers.validation import reference
    arc = probe_fake(fake_torch("xpu", props=ARC), fp64_runs=lambda torch_mod, dev: dev == "cpu")
    monkeypatch.setattr(device, "capabilities", lambda: arc)
    records, _ = reference.record({"y": torch.ones(3, 4)})
    assert records["y"]["norm"] == pytest.approx(12 ** 0.5)


def test_synchronize_waits_for_the_device_it_is_given(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda dev=None: waited.append(dev))
    device.synchronize("cuda:1")
    device.synchronize("cpu")
    assert waited == [torch.device("cuda:1")]


def test_cpu_capability_is_what_aten_dispatches_to():
    assert device.cpu_capability() == torch.backends.cpu.get_cpu_capability()
