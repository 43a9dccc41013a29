"""One prepared GPU run: estimate_memory's CUDA figures against the allocator's counters, profile_model's
CUDA verdicts, and the GPU-marked tests; one JSON and one Markdown table out.

Run (on a machine with a CUDA device; needs torch, and pydantic/mcp/pytest or their carried wheels):

    python bench/gpu_check.py --out /tmp/gpu            # everything, about 6 minutes on one H100
    python bench/gpu_check.py --out /tmp/gpu --dry      # CPU plumbing check: 2 memory cases, 1 profile case
    python bench/gpu_check.py --out /tmp/gpu --phases tests,memory --budget-s 300   # some phases, in this order

Writes OUT/gpu_check.json, OUT/gpu_check.md and the GPU-marked tests' whole log, OUT/gpu_tests.log.

Memory: each case runs in a fresh process (an empty caching allocator, no cuBLAS workspace yet), eight at a
time (each process has its own allocator counters, so they do not disturb each other). A case first runs
`torch_skills.memory.groundtruth.measure_real_step` (three real steps; `max_memory_allocated()` and
`max_memory_reserved()` after `reset_peak_memory_stats()`, plus the allocator's exact `requested_bytes`
peak), then calls the tool's own worker, `torch_skills.memory.worker.run`, with target_device="cuda" on the
same user-code path (the worker's `_Tracer` builds the model, batch and loss for both). Profile cases run
after, one at a time in one process (timings need the GPU to themselves), through
`torch_skills.profiling.worker.run`.

Then the skills' CUDA-only code blocks run one by one as scripts (bench/gpu/skillblocks.py), and the GPU-marked
pytest tests (check_gradients under CUDA and float16 autocast, verify_checkpoint loading onto CUDA, profile_model
and estimate_memory on CUDA, check_distributed with nccl where two GPUs exist). Without mcp/pytest on the device
it unpacks the wheels carried in bench/gpu/build/wheels (make them with `pip download --only-binary=:all:
--python-version 3.X --platform manylinux2014_x86_64 mcp pytest pytest-asyncio hypothesis -d bench/gpu/build/wheels`).

Known limitations: one GPU, so check_distributed's nccl test is skipped unless the device has two.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import glob
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / "bench" / "gpu" / "build" / "wheels"
MiB = 2**20
# Each phase's share of --budget-s, renormalized over the phases still to run (memory runs 8 cases at a time).
PHASE_SHARES = {"memory": 0.42, "profile": 0.13, "blocks": 0.23, "tests": 0.5}
ALLOC_GOAL, RESERVED_GOAL = 0.03, 0.10  # issue 28: allocated within 3%, reserved within 10%
MEM = "tests/fixtures/memory_models.py"
EZ = "evals/models/zoo.py"
GM = "bench/gpu/models.py"
PS = "evals/models/profile_model_scenarios.py"


# -- environment ---------------------------------------------------------------------------------
def _compatible(wheel: str, tag: str) -> bool:
    """A wheel this Python can import: pure, abi3, or built for this CPython."""
    name = os.path.basename(wheel)
    return "-none-any" in name or "-abi3-" in name or f"-{tag}-" in name


def _blocks_only(wheel: str) -> bool:
    """Wheels only the skills' blocks import (torchao): on every path, transformers imports them too, and
    a torchao built for another torch broke four hf_* memory cases on the device."""
    return os.path.basename(wheel).startswith("torchao")


def _carried_wheels(blocks_only: bool) -> list[str]:
    """The carried wheels this Python can import, either the blocks-only ones or all the others."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return [
        w
        for w in sorted(glob.glob(str(WHEELS / "*.whl")))
        if _compatible(w, tag) and _blocks_only(w) == blocks_only
    ]


def _unpack(wheels: list[str], prefix: str) -> str:
    """Extract `wheels` into a new temporary folder (an importable site) and return it."""
    target = tempfile.mkdtemp(prefix=prefix)
    for w in wheels:
        zipfile.ZipFile(w).extractall(target)
    return target


def blocks_path() -> str:
    """A folder holding the blocks-only wheels, for the skill-block scripts' PYTHONPATH."""
    return _unpack(_carried_wheels(blocks_only=True), "gpu_check_blocks_")


def ensure_vendored() -> str:
    """Import pydantic, mcp and pytest-asyncio, else unpack the carried wheels for this Python into a temp
    dir put first on sys.path and PYTHONPATH (children inherit it); say which."""
    if all(has(m) for m in ("pydantic", "mcp", "pytest_asyncio", "anyio")):
        import pydantic

        return f"installed {pydantic.VERSION}"
    wheels = _carried_wheels(blocks_only=False)
    if not any("pydantic_core" in w for w in wheels):
        raise SystemExit(f"no pydantic and no pydantic_core wheel for this Python in {WHEELS}")
    target = _unpack(wheels, "gpu_check_vendor_")
    sys.path.insert(0, target)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [target, os.environ.get("PYTHONPATH")]))
    importlib.invalidate_caches()
    import pydantic

    return f"vendored {pydantic.VERSION} and {len(wheels)} wheels (cp{sys.version_info.major}{sys.version_info.minor})"


def setup_path() -> None:
    for p in (str(REPO), str(REPO / "tools")):
        if p not in sys.path:
            sys.path.insert(0, p)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), str(REPO / "tools"), os.environ.get("PYTHONPATH")])
    )


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def environment() -> dict:
    import torch

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "capability": list(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None,
        "transformers": has("transformers"),
        "pytest": has("pytest"),
        "mcp": has("mcp"),
    }
    if torch.cuda.is_available():
        env["context"] = measure_context()
    return env


def measure_context() -> dict:
    """Device memory used outside the allocator once CUDA, cuBLAS and a kernel are loaded (no other process)."""
    import torch

    free0, total = torch.cuda.mem_get_info()
    a = torch.randn(256, 256, device="cuda")
    (a @ a).sum().item()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    used = total - free
    reserved = torch.cuda.memory_reserved()
    del a
    return {"used_bytes": used, "reserved_bytes": reserved, "outside_allocator_bytes": used - reserved,
            "used_after_init_bytes": total - free0}  # fmt: skip


# -- memory cases ----------------------------------------------------------------------------------
def memory_cases(cuda: bool, hf: bool) -> list[dict]:
    """Each case: a label and the EstimateMemoryRequest fields (model, inputs, loss, batch, mode, precision, AC)."""
    zoo = [  # (name, model, inputs, loss, batch, checkpoint class or None)
        (
            "gpt_medium",
            f"{GM}:gpt_medium",
            f"{GM}:gpt_medium_inputs",
            f"{MEM}:next_token_loss",
            8,
            "GPTBlock",
        ),
        (
            "llama_medium",
            f"{GM}:llama_medium",
            f"{GM}:llama_medium_inputs",
            f"{MEM}:next_token_loss",
            4,
            "LlamaBlock",
        ),
        ("vit_small", f"{GM}:vit_small", f"{GM}:vit_inputs", None, 32, "ViTBlock"),
        ("encoder_torch", f"{GM}:encoder_torch", f"{GM}:encoder_inputs", None, 16, "TransformerEncoderLayer"),
        ("gpt_sdpa", f"{MEM}:build_gpt", f"{MEM}:gpt_inputs", f"{MEM}:next_token_loss", 8, "GPTBlock"),
        (
            "llama_tiny",
            f"{MEM}:build_llama",
            f"{MEM}:llama_inputs",
            f"{MEM}:next_token_loss",
            4,
            "LlamaBlock",
        ),
        ("mlp", f"{MEM}:build_mlp", f"{MEM}:mlp_inputs", None, 64, None),
        ("cnn_bn", f"{MEM}:build_cnn", f"{MEM}:image_inputs", None, 16, None),
        ("resnet", f"{MEM}:build_resnet", f"{MEM}:image_inputs", None, 16, None),
        ("lstm", f"{MEM}:build_lstm", f"{MEM}:lstm_inputs", None, 16, None),
        ("recommender", f"{MEM}:build_recommender", f"{MEM}:recommender_inputs", None, 512, None),
        ("unet", f"{MEM}:build_unet", f"{MEM}:unet_inputs", None, 4, None),
        ("tiny_gpt", f"{EZ}:tiny_gpt", f"{EZ}:token_pair", None, 8, "_Block"),
    ]
    if hf:
        zoo[4:4] = [
            ("hf_gpt2", f"{GM}:hf_gpt2", f"{GM}:hf_lm_batch", None, 8, "GPT2Block"),
            ("hf_bert", f"{GM}:hf_bert", f"{GM}:hf_lm_batch", None, 8, "BertLayer"),
            ("hf_llama", f"{GM}:hf_llama", f"{GM}:hf_lm_batch", None, 4, "LlamaDecoderLayer"),
            ("hf_vit", f"{GM}:hf_vit", f"{GM}:hf_image_batch", None, 32, "ViTLayer"),
        ]
    small = {"mlp", "cnn_bn", "resnet", "lstm", "recommender", "unet", "tiny_gpt"}  # fp32 and autocast only
    cases = []
    for name, model, inputs, loss, batch, block in zoo:
        precisions = ["fp32", "bf16_autocast", "bf16"] if cuda else ["fp32"]
        if name in small:
            precisions, block = precisions[:2], None
        for mode in ("train", "inference"):
            for precision in precisions:
                cases.append(dict(name=name, model=model, inputs=inputs, loss=loss, batch_size=batch,
                                  mode=mode, precision=precision, ac=None))  # fmt: skip
        if block:
            for precision in precisions:
                cases.append(dict(name=name, model=model, inputs=inputs, loss=loss, batch_size=batch,
                                  mode="train", precision=precision, ac=block))  # fmt: skip
    return cases


def run_memory_case(case: dict, device: str) -> dict:
    """In a fresh process: ground truth first (an empty allocator), then the tool's worker."""
    import torch

    from torch_skills.memory.groundtruth import measure_real_step
    from torch_skills.memory.models import EstimateMemoryRequest
    from torch_skills.memory.trace import StepSpec
    from torch_skills.memory.worker import _Tracer
    from torch_skills.memory.worker import run as estimate
    from torch_skills.runner.child import JobContext

    request = EstimateMemoryRequest(
        model=case["model"], inputs=case["inputs"], loss=case["loss"], batch_size=case["batch_size"],
        mode=case["mode"], precision=case["precision"], optimizer="adamw",
        activation_checkpointing=[case["ac"]] if case["ac"] else "off",
        target_device="cuda" if device == "cuda" else "cpu", device=device,
    )  # fmt: skip
    job = JobContext(Path(tempfile.mkdtemp(prefix="gpu_check_job_")), device, [str(REPO)], str(REPO))
    spec = StepSpec(mode=request.mode, optimizer="adamw", precision=request.precision,
                    checkpoint_classes=request.checkpoint_classes, foreach=device == "cuda")  # fmt: skip
    tracer = _Tracer(request, job, spec, torch.device(device), probe_scratch=True)
    out = dict(case)
    started = time.perf_counter()
    truth = measure_real_step(
        tracer.build, tracer.batch, tracer.loss, spec, batch_size=case["batch_size"], device=device
    )
    out["truth_s"] = time.perf_counter() - started
    out["truth_allocated"] = truth.peak_allocated_bytes
    out["truth_reserved"] = truth.peak_reserved_bytes
    if device == "cuda":
        stats = torch.cuda.memory_stats()
        out["truth_requested"] = stats.get("requested_bytes.all.peak")
        out["truth_segments_peak"] = stats.get("segment.all.peak")
        out["truth_alloc_retries"] = stats.get("num_alloc_retries")
        out["cublas_workspace_config"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        tracer.model = None
        import gc

        gc.collect()
        torch.cuda.empty_cache()
    started = time.perf_counter()
    result = estimate(request, job)
    out["estimate_s"] = time.perf_counter() - started
    out.update(
        method=result.method, traced_on=result.traced_on,
        est_allocated=result.peak_allocated_bytes, est_reserved=result.peak_reserved_bytes,
        est_tensor=result.peak_tensor_bytes, est_context=result.cuda_context_bytes,
        est_workspace=result.cublas_workspace_bytes, est_phase=result.peak_phase, est_module=result.peak_module,
        est_op=result.peak_op, est_breakdown=result.breakdown.model_dump(), est_phase_peaks=result.phase_peaks,
    )  # fmt: skip
    return out


def memory_phase(cases: list[dict], device: str, deadline: float, workers: int) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS="2", TORCH_SKILLS_NO_PREWARM="1")

    def one(case: dict) -> dict:
        if time.monotonic() > deadline:
            return dict(case, error="not run: time budget spent")
        cmd = [sys.executable, __file__, "--memory-case", json.dumps(case), "--device", device]
        limit = max(30.0, min(150.0, deadline + 90 - time.monotonic()))
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env, cwd=REPO)
        except subprocess.TimeoutExpired:
            return dict(case, error=f"timed out after {limit:.0f} s")
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if not lines:  # a signal's death leaves no traceback: say the exit status
            return dict(case, error=(p.stderr + p.stdout)[-1500:] + f"\n(exit status {p.returncode})")
        # a process that printed its figures and then died (at exit, say) still measured them
        return dict(json.loads(lines[-1]), **({"exit_status": p.returncode} if p.returncode else {}))

    with cf.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, cases))


# -- profile cases --------------------------------------------------------------------------------
def profile_cases(cuda: bool) -> list[dict]:
    cases = [  # (label, expected verdict, request fields)
        ("big_matmul 512x1024x1024 fp32 inference", "compute",
         dict(model=f"{PS}:big_matmul", input_shape=[512, 1024], mode="inference", cpu_threads=1)),
        ("tiny_ops 120 layers train", "cpu_overhead", dict(model=f"{PS}:tiny_ops", input_shape=[4, 16])),
        ("sync_every_layer .item() x8 train", "cpu_overhead",
         dict(model=f"{PS}:sync_every_layer", input_shape=[16, 32], cpu_threads=1)),
        ("sleepy_loader 0.1 s/batch train", "data_loading",
         dict(model=f"{PS}:small_mlp", data=f"{PS}:sleepy_loader", warmup_steps=1, active_steps=4, cpu_threads=1)),
        ("elementwise 64x16384 inference", "memory_bandwidth",
         dict(model=f"{PS}:elementwise", input_shape=[64, 16384], mode="inference", cpu_threads=1)),
    ]  # fmt: skip
    if cuda:
        cases += [
            ("matmul_8k bf16 inference", "compute",
             dict(model=f"{GM}:matmul_8k", input_shape=[8192, 8192], mode="inference", precision="bf16")),
            ("elementwise 64x1048576 inference", "memory_bandwidth",
             dict(model=f"{PS}:elementwise", input_shape=[64, 1048576], mode="inference")),
            ("gpt_medium bf16_autocast train", None,
             dict(model=f"{GM}:gpt_medium", inputs=f"{GM}:gpt_medium_inputs", loss=f"{MEM}:next_token_loss",
                  batch_size=8, precision="bf16_autocast", warmup_steps=2, active_steps=5)),
        ]  # fmt: skip
    else:
        cases = cases[:1]
    return [dict(label=label, expect=expect, request=req) for label, expect, req in cases]


def run_profile_cases(cases: list[dict], device: str, deadline: float) -> list[dict]:
    """In one process, one after another: each through the tool's worker."""
    from torch_skills.profiling.models import ProfileRequest
    from torch_skills.profiling.worker import run as profile
    from torch_skills.runner.child import JobContext

    out = []
    for case in cases:
        if time.time() > deadline:
            out.append(dict(case, error="not run: time budget spent"))
            continue
        fields = dict(case["request"])
        fields.pop("batch_size", None)
        job = JobContext(Path(tempfile.mkdtemp(prefix="gpu_check_prof_")), device, [str(REPO)], str(REPO))
        started = time.perf_counter()
        try:
            r = profile(ProfileRequest(device=device, **fields), job)
        except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
            out.append(
                dict(case, error=f"{type(exc).__name__}: {exc}"[:1500], trace=traceback.format_exc()[-1500:])
            )
            continue
        out.append(dict(
            case, wall_s=time.perf_counter() - started, bottleneck=r.bottleneck, uncertain=r.verdict_uncertain,
            uncertainty=r.uncertainty, step_time_s=r.step_time_s, profiled_step_time_s=r.profiled_step_time_s,
            profiler_overhead_ratio=r.profiler_overhead_ratio, flops_per_step=r.flops_per_step,
            achieved_flops_per_s=r.achieved_flops_per_s, attainable_flops_per_s=r.attainable_flops_per_s,
            peak_flops_per_s=r.peak_flops_per_s, peak_flops_source=r.peak_flops_source, mfu=r.mfu,
            host_syncs_per_step=r.host_syncs_per_step, sync_wait_s=r.sync_wait_s, data_wait_share=r.data_wait_share,
            shares=r.shares.model_dump(), device_name=r.device_name, peak_memory_bytes=r.peak_memory_bytes,
            findings=[f.code for f in r.findings], summary=r.summary, probe_error=r.probe_error,
        ))  # fmt: skip
        print(
            json.dumps({"profile_done": case["label"], "bottleneck": r.bottleneck}),
            file=sys.stderr,
            flush=True,
        )
    return out


def profile_phase(cases: list[dict], device: str, deadline: float) -> list[dict]:
    budget = max(10.0, deadline - time.time())
    path = Path(tempfile.mkdtemp(prefix="gpu_check_pp_")) / "profile.json"
    cmd = [sys.executable, __file__, "--profile-cases", json.dumps(cases), "--device", device,
           "--deadline", str(deadline - 20), "--result", str(path)]  # fmt: skip
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=budget, cwd=REPO)
    except subprocess.TimeoutExpired:
        return [dict(c, error="profile process timed out") for c in cases]
    if not path.exists():
        return [dict(c, error=(p.stderr or p.stdout)[-1500:]) for c in cases]
    return json.loads(path.read_text())


# -- GPU-marked tests -----------------------------------------------------------------------------
def gpu_tests(env: dict, timeout: float, log: Path) -> dict:
    """Run the GPU-marked tests verbosely into `log` (whole), so a run cut short still shows each test that ended."""
    listed = subprocess.run(
        ["grep", "-rln", "mark.gpu", "tests"], capture_output=True, text=True, cwd=REPO
    ).stdout
    files = sorted(listed.split())
    if not (env["pytest"] and env["mcp"]):
        return {"status": "not run", "reason": f"pytest={env['pytest']} mcp={env['mcp']} on this machine",
                "files": files}  # fmt: skip
    cmd = [sys.executable, "-m", "pytest", "-v", "-rA", "--durations=15", "-m", "gpu", "-p", "no:cacheprovider",
           *files]  # fmt: skip
    with log.open("w") as sink:
        p = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        try:
            status = f"exit {p.wait(timeout=timeout)}"
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            status = f"timed out after {timeout:.0f} s"
    text = log.read_text(errors="replace")
    return {"status": status, "files": files, "tail": text[-3000:], "log": log.name}


def skill_blocks(timeout: float, only: list[str]) -> dict:
    """The skills' CUDA-only blocks, each run as a script (bench/gpu/skillblocks.py, one JSON line per block);
    `only`: substrings of the blocks' places to run (all when empty)."""
    cmd = [sys.executable, str(REPO / "bench" / "gpu" / "skillblocks.py"), *only]
    status = None
    try:
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, [blocks_path(), os.environ.get("PYTHONPATH")])),
        )
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
        stdout, tail = p.stdout, p.stderr[-2000:]
    except subprocess.TimeoutExpired as e:
        stdout, tail, status = (
            (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""),
            "",
            "timed out",
        )
    blocks = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    ran = [b for b in blocks if b["passed"] is not None]
    summary = f"{sum(b['passed'] for b in ran)}/{len(ran)} passed, {len(blocks) - len(ran)} need several GPUs"
    summary += f" ({status})" if status else ""
    return {"status": summary, "blocks": blocks, "tail": tail}


# -- report ---------------------------------------------------------------------------------------
def rel(est, truth):
    return (est - truth) / truth if est is not None and truth else None


def pct(x):
    return "-" if x is None else f"{100 * x:+.1f}%"


def mib(x):
    return "-" if x is None else f"{x / MiB:.1f}"


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# gpu_check", "",
        f"Device: {env['device']} (capability {env.get('capability')}); torch {env['torch']}, CUDA {env['cuda']}, "
        f"cuDNN {env['cudnn']}, Python {env['python']}; pydantic {report['pydantic']}; transformers "
        f"{'yes' if env['transformers'] else 'no'}. Wall time {report['wall_s']:.0f} s.", "",
    ]  # fmt: skip
    ctx = env.get("context")
    if ctx:
        est_ctx = next((r.get("est_context") for r in report["memory"] if r.get("est_context")), None)
        lines += [f"CUDA context (device memory used outside the allocator after init + one matmul): "
                  f"{mib(ctx['outside_allocator_bytes'])} MiB measured; estimate_memory states {mib(est_ctx)} MiB.", ""]  # fmt: skip
    lines += [
        "## estimate_memory on CUDA vs max_memory_allocated / max_memory_reserved (3 real steps, fresh process)", "",
        "Errors are (estimate - measured) / measured; `*` marks a case outside 3% (allocated) or 10% (reserved). "
        "'requested' is the allocator's exact requested-bytes peak (no 512 B rounding); 'tensor' is the "
        "estimate's exact-bytes peak.", "",
        "| model | mode | precision | AC | batch | alloc meas MiB | alloc est MiB | err | reserved meas | reserved est | err "
        "| requested meas | tensor est | err | est phase / op |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in report["memory"]:
        died = f" (then exit {r['exit_status']})" if r.get("exit_status") else ""
        head = f"| {r['name']}{died} | {r['mode']} | {r['precision']} | {r['ac'] or '-'} | {r['batch_size']} "
        if "error" in r:
            lines.append(
                head
                + f"| error: {r['error'].strip().splitlines()[-1][:160] if r['error'].strip() else '?'} |"
            )
            continue
        ea, er = rel(r["est_allocated"], r["truth_allocated"]), rel(r["est_reserved"], r["truth_reserved"])
        et = rel(r["est_tensor"], r.get("truth_requested"))
        fa = "*" if ea is not None and abs(ea) > ALLOC_GOAL else ""
        fr = "*" if er is not None and abs(er) > RESERVED_GOAL else ""
        lines.append(
            head + f"| {mib(r['truth_allocated'])} | {mib(r['est_allocated'])} | {pct(ea)}{fa} "
            f"| {mib(r['truth_reserved'])} | {mib(r['est_reserved'])} | {pct(er)}{fr} "
            f"| {mib(r.get('truth_requested'))} | {mib(r['est_tensor'])} | {pct(et)} | {r['est_phase']} / {r['est_op']} |"
        )
    ok = [r for r in report["memory"] if "error" not in r]
    if ok:
        a = [abs(rel(r["est_allocated"], r["truth_allocated"])) for r in ok]
        rs = [abs(rel(r["est_reserved"], r["truth_reserved"])) for r in ok if r["truth_reserved"]]
        lines += ["", f"{len(ok)} cases measured: allocated within 3% in {sum(x <= ALLOC_GOAL for x in a)}, "
                  f"median |error| {100 * sorted(a)[len(a) // 2]:.1f}%; reserved within 10% in "
                  f"{sum(x <= RESERVED_GOAL for x in rs)} of {len(rs)}"
                  + (f", median |error| {100 * sorted(rs)[len(rs) // 2]:.1f}%." if rs else ".")]  # fmt: skip
    lines += ["", "## profile_model on the device", "",
              "| case | expected | verdict | uncertain | step ms | profiled ms | profiler overhead | GFLOP/step "
              "| achieved TFLOP/s | attainable TFLOP/s | peak TFLOP/s | MFU | syncs/step | findings |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in report["profile"]:
        if "error" in r:
            lines.append(
                f"| {r['label']} | {r['expect']} | error: {(r['error'].strip().splitlines() or ['?'])[-1][:160]} |"
            )
            continue
        mark = "" if r["expect"] in (None, r["bottleneck"]) else " (differs)"
        tf = lambda x: "-" if x is None else f"{x / 1e12:.2f}"  # noqa: E731
        lines.append(
            f"| {r['label']} | {r['expect'] or '-'} | {r['bottleneck']}{mark} | {r['uncertain']} "
            f"| {1e3 * r['step_time_s']:.3f} | {1e3 * r['profiled_step_time_s']:.3f} | {r['profiler_overhead_ratio']:.2f}x "
            f"| {r['flops_per_step'] / 1e9:.2f} | {tf(r['achieved_flops_per_s'])} | {tf(r['attainable_flops_per_s'])} "
            f"| {tf(r['peak_flops_per_s'])} | {pct(r['mfu']).lstrip('+')} "
            f"| {r['host_syncs_per_step']} | {', '.join(r['findings'])} |"
        )
    b = report.get("skill_blocks", {"status": "not run", "blocks": []})
    lines += ["", "## The skills' CUDA blocks, each run as a script", "", b["status"], ""]
    word = {True: "pass", False: "FAIL", None: "not run"}
    lines += [f"- {word[x['passed']]} {x['block']} ({x['seconds']} s)" for x in b["blocks"]]
    for x in b["blocks"]:
        if x["passed"] is False:
            lines += ["", f"{x['block']}:", "```", x["detail"][-800:], "```"]
    t = report["gpu_tests"]
    lines += ["", "## GPU-marked tests", "", f"{t['status']}" + (f": {t['reason']}" if "reason" in t else ""),
              "", "Files: " + ", ".join(t["files"]) + (f" (whole log: {t['log']})" if "log" in t else "")]  # fmt: skip
    if "tail" in t:
        lines += ["", "```", t["tail"][-1500:], "```"]
    return "\n".join(lines) + "\n"


# -- main -----------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", str(REPO / "bench" / "results" / "gpu")))
    ap.add_argument(
        "--dry", action="store_true", help="CPU plumbing check: two memory cases, one profile case"
    )
    ap.add_argument(
        "--budget-s", type=float, default=380.0, help="seconds for all phases, shared by PHASE_SHARES"
    )
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--phases", default="memory,profile,blocks,tests",
                    help="comma-separated subset of memory,profile,blocks,tests, run in this order, each with its "
                         "share of --budget-s (a rerun of what failed)")  # fmt: skip
    ap.add_argument(
        "--blocks",
        nargs="*",
        default=[],
        help="run only the CUDA blocks whose place (file:line) holds one of these substrings",
    )
    ap.add_argument("--device", default=None)
    ap.add_argument("--memory-case", help=argparse.SUPPRESS)
    ap.add_argument("--profile-cases", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    pyd = ensure_vendored()
    setup_path()
    if args.memory_case:
        print(json.dumps(run_memory_case(json.loads(args.memory_case), args.device)), flush=True)
        return
    if args.profile_cases:
        res = run_profile_cases(json.loads(args.profile_cases), args.device, args.deadline)
        Path(args.result).write_text(json.dumps(res))
        return

    import torch

    start = time.time()
    cuda = torch.cuda.is_available() and not args.dry
    device = args.device or ("cuda" if cuda else "cpu")
    env = environment()
    print(json.dumps({"environment": env, "pydantic": pyd}), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    phases = [x for x in args.phases.split(",") if x]
    unknown = set(phases) - set(PHASE_SHARES)
    if unknown:
        raise SystemExit(f"unknown phases {sorted(unknown)}: choose from {sorted(PHASE_SHARES)}")
    report = {"environment": env, "pydantic": pyd, "device": device, "wall_s": 0.0, "memory": [], "profile": [],
              "gpu_tests": {"status": "not run: not asked", "files": []},
              "skill_blocks": {"status": "not run: not asked", "blocks": []}}  # fmt: skip

    def write() -> None:  # after every phase, so a run cut short still leaves its figures
        report["wall_s"] = time.time() - start
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
        (out / "gpu_check.md").write_text(markdown(report))

    for i, phase in enumerate(phases):  # in the order asked: the first gets its share first
        left = start + args.budget_s - time.time()
        share = PHASE_SHARES[phase] / sum(PHASE_SHARES[x] for x in phases[i:])
        deadline = time.time() + max(10.0, share * left)
        if phase == "memory":
            mcases = memory_cases(cuda, env["transformers"])
            if not cuda:
                mcases = [c for c in mcases if c["name"] in ("mlp", "tiny_gpt")][:3]
            span = (
                deadline - time.time()
            )  # cases start until 90 s before the end (a late one still gets 90 s)
            mono = time.monotonic() + max(span - 90, span / 2)
            report["memory"] = memory_phase(mcases, device, mono, args.workers if cuda else 2)
            done = sum("error" not in r for r in report["memory"])
            status = f"{done}/{len(mcases)} cases"
        elif phase == "profile":
            report["profile"] = profile_phase(profile_cases(cuda), device, deadline)
            status = f"{sum('error' not in r for r in report['profile'])} cases"
        elif phase == "blocks":
            report["skill_blocks"] = (
                skill_blocks(max(10.0, deadline - time.time()), args.blocks)
                if cuda
                else {"status": "not run: no CUDA device", "blocks": []}
            )
            status = report["skill_blocks"]["status"]
        else:
            report["gpu_tests"] = gpu_tests(env, max(10.0, deadline - time.time()), out / "gpu_tests.log")
            status = report["gpu_tests"]["status"]
        write()
        print(f"{phase}: {status} at {time.time() - start:.0f} s", flush=True)
    print((out / "gpu_check.md").read_text())


if __name__ == "__main__":
    main()
