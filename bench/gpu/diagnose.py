"""Follow-up to bench/gpu_check.py: where the CUDA estimate and the allocator disagree.

Run (CUDA device; same requirements as gpu_check.py):

    python bench/gpu/diagnose.py --out /tmp/gpu        # about 90 s on one H100; writes OUT/diagnose.json

Three probes, each case in a fresh process (eight at a time):
- SDPA back-end sweep: the measured peak and the estimate with SDPA forced to each back-end
  (`torch.nn.attention.sdpa_kernel`), plus `torch._fused_sdp_choice` for the case's attention shape;
- nn.TransformerEncoder inference with the fused fast path off (`torch.backends.mha.set_fastpath_enabled`);
- per-phase and per-step truth: `max_memory_allocated/reserved` for forward, backward and optimizer step
  of each of three steps (peaks reset between phases), next to the estimate's `phase_peaks`, and the
  estimate's method and method_detail (why a trace fell back to real runs).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("gpu_check", HERE.parent / "gpu_check.py")
gc_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gc_mod)

SDPA_CASES = [  # (model name, precision, ac, attention shape (B, H, T, D), causal)
    ("vit_small", "bf16", None, (32, 6, 197, 64), False),
    ("vit_small", "fp32", None, (32, 6, 197, 64), False),
    ("hf_bert", "bf16", None, (8, 12, 512, 64), False),
    ("encoder_torch", "fp32", None, (16, 12, 512, 64), False),
    ("encoder_torch", "bf16", None, (16, 12, 512, 64), False),
    ("gpt_medium", "bf16", None, (8, 12, 1024, 64), True),
]
BACKENDS = ["default", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]
PHASE_CASES = [  # (model name, mode, precision, ac)
    ("lstm", "train", "fp32", None),
    ("lstm", "train", "bf16_autocast", None),
    ("llama_medium", "train", "fp32", None),
    ("llama_medium", "train", "fp32", "LlamaBlock"),
    ("hf_bert", "train", "fp32", "BertLayer"),
    ("gpt_medium", "train", "bf16_autocast", "GPTBlock"),
    ("hf_llama", "train", "bf16", "LlamaDecoderLayer"),
    ("encoder_torch", "train", "bf16", "TransformerEncoderLayer"),
    ("vit_small", "train", "bf16", None),
    ("gpt_medium", "train", "fp32", None),
]


def find_case(name: str, mode: str, precision: str, ac) -> dict:
    for c in gc_mod.memory_cases(True, True):
        if (c["name"], c["mode"], c["precision"], c["ac"]) == (name, mode, precision, ac):
            return dict(c)
    raise KeyError((name, mode, precision, ac))


def sdp_choice(shape, dtype_name: str, causal: bool) -> str:
    import torch

    dtype = torch.float32 if dtype_name == "fp32" else torch.bfloat16
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    choice = torch._fused_sdp_choice(q, k, v, None, 0.0, causal)
    from torch.nn.attention import SDPBackend

    return next((n for n, b in SDPBackend.__members__.items() if int(b) == int(choice)), str(choice))


def phase_truth(case: dict) -> list[dict]:
    """Three real steps with the peak counters reset at each phase: allocated and reserved per phase."""
    import torch

    from torch_skills.memory.groundtruth import _prepare
    from torch_skills.memory.models import EstimateMemoryRequest
    from torch_skills.memory.trace import (
        AUTOCAST,
        LOW_PRECISION,
        StepSpec,
        call_model,
        convert_tensors,
        make_optimizer,
        wrap_checkpointing,
    )
    from torch_skills.memory.worker import _Tracer
    from torch_skills.runner.child import JobContext

    request = EstimateMemoryRequest(
        model=case["model"], inputs=case["inputs"], loss=case["loss"], batch_size=case["batch_size"],
        mode=case["mode"], precision=case["precision"], activation_checkpointing=[case["ac"]] if case["ac"] else "off",
        target_device="cuda", device="cuda",
    )  # fmt: skip
    spec = StepSpec(mode=request.mode, optimizer="adamw", precision=request.precision,
                    checkpoint_classes=request.checkpoint_classes, foreach=True)  # fmt: skip
    job = JobContext(Path("/tmp"), "cuda", [str(gc_mod.REPO)], str(gc_mod.REPO))
    tracer = _Tracer(request, job, spec, torch.device("cuda"), probe_scratch=True)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = tracer.build()
    low = LOW_PRECISION.get(spec.precision)
    convert_tensors(model, dev, low)
    wrap_checkpointing(model, spec.checkpoint_classes)
    model.train()
    batch = _prepare(tracer.batch(case["batch_size"]), dev, low)
    opt = make_optimizer(model, spec)
    auto = (
        (lambda: torch.autocast("cuda", dtype=AUTOCAST[spec.precision]))
        if spec.precision in AUTOCAST
        else contextlib.nullcontext
    )
    steps = []

    def mark(rec: dict, phase: str) -> None:
        torch.cuda.synchronize()
        rec[phase] = torch.cuda.max_memory_allocated()
        rec[phase + "_reserved"] = torch.cuda.max_memory_reserved()
        torch.cuda.reset_peak_memory_stats()

    for _ in range(3):
        rec: dict = {}
        torch.cuda.reset_peak_memory_stats()
        with auto():
            out = call_model(model, batch)
            loss = tracer.loss(out, batch)
        mark(rec, "forward")
        loss.backward()
        mark(rec, "backward")
        opt.step()
        opt.zero_grad(set_to_none=True)
        mark(rec, "optimizer_step")
        del out, loss
        rec["segments"] = torch.cuda.memory_stats().get("segment.all.current")
        steps.append(rec)
    return steps


def run_one(job: dict) -> dict:
    import torch

    out = {"job": job}
    case = job["case"]
    if job.get("sdp_shape"):
        try:
            out["sdp_choice"] = sdp_choice(
                job["sdp_shape"], "fp32" if case["precision"] == "fp32" else "bf16", job["causal"]
            )
        except Exception as exc:  # noqa: BLE001
            out["sdp_choice"] = f"error: {exc}"[:300]
        torch.cuda.empty_cache()
    if job.get("phases"):
        out["phases"] = phase_truth(case)
        import gc

        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    ctx = contextlib.nullcontext()
    if job.get("backend", "default") != "default":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ctx = sdpa_kernel([getattr(SDPBackend, job["backend"])])
    if job.get("fastpath") is False:
        torch.backends.mha.set_fastpath_enabled(False)
    if not job.get("phases"):
        with ctx:
            try:
                res = gc_mod.run_memory_case(case, "cuda")
                out.update({k: res[k] for k in ("truth_allocated", "truth_reserved", "truth_requested", "est_allocated",
                                                "est_reserved", "est_tensor", "est_phase", "est_op", "method")})  # fmt: skip
            except Exception as exc:  # noqa: BLE001
                out["error"] = f"{type(exc).__name__}: {exc}"[:600]
    else:
        from torch_skills.memory.models import EstimateMemoryRequest
        from torch_skills.memory.worker import run as estimate
        from torch_skills.runner.child import JobContext

        request = EstimateMemoryRequest(
            model=case["model"], inputs=case["inputs"], loss=case["loss"], batch_size=case["batch_size"],
            mode=case["mode"], precision=case["precision"], activation_checkpointing=[case["ac"]] if case["ac"] else "off",
            target_device="cuda", device="cuda",
        )  # fmt: skip
        r = estimate(request, JobContext(Path("/tmp"), "cuda", [str(gc_mod.REPO)], str(gc_mod.REPO)))
        out.update(method=r.method, method_detail=r.method_detail, est_phase_peaks=r.phase_peaks,
                   est_allocated=r.peak_allocated_bytes, est_reserved=r.peak_reserved_bytes,
                   findings=[f.code for f in r.findings], summary=r.summary[:600])  # fmt: skip
    return out


def jobs() -> list[dict]:
    out = []
    for name, prec, ac, shape, causal in SDPA_CASES:
        for b in BACKENDS:
            out.append({"kind": "sdpa", "backend": b, "case": find_case(name, "train", prec, ac),
                        "sdp_shape": shape if b == "default" else None, "causal": causal})  # fmt: skip
    for prec in ("fp32", "bf16"):
        out.append(
            {
                "kind": "fastpath_off",
                "fastpath": False,
                "case": find_case("encoder_torch", "inference", prec, None),
            }
        )
    for name, mode, prec, ac in PHASE_CASES:
        out.append({"kind": "phases", "phases": True, "case": find_case(name, mode, prec, ac)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu"))
    ap.add_argument("--job")
    ap.add_argument("--budget-s", type=float, default=150)
    args = ap.parse_args()
    gc_mod.ensure_pydantic()
    gc_mod.setup_path()
    if args.job:
        print(json.dumps(run_one(json.loads(args.job)), default=str), flush=True)
        return
    start = time.monotonic()
    env = dict(os.environ, OMP_NUM_THREADS="2", TORCH_SKILLS_NO_PREWARM="1")

    def one(job: dict) -> dict:
        if time.monotonic() - start > args.budget_s:
            return {"job": job, "error": "not run: budget"}
        try:
            p = subprocess.run([sys.executable, __file__, "--job", json.dumps(job)], capture_output=True, text=True,
                               timeout=90, env=env, cwd=gc_mod.REPO)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"job": job, "error": "timeout"}
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else {"job": job, "error": (p.stderr or p.stdout)[-1200:]}

    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, jobs()))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "diagnose.json").write_text(json.dumps(results, indent=1, default=str))
    M = 2**20
    for r in results:
        j = r["job"]
        c = j["case"]
        head = f"{j['kind']:12s} {c['name']:14s} {c['mode']:9s} {c['precision']:13s} {str(c['ac']):24s} {j.get('backend', ''):20s}"
        if "error" in r:
            print(head, "ERROR", r["error"].strip().splitlines()[-1][:200] if r["error"].strip() else "?")
        elif j["kind"] == "phases":
            s3 = r["phases"][-1]
            print(head, r["method"], "est", {k: round(v / M, 1) for k, v in r["est_phase_peaks"].items()},
                  "truth step3", {k: round(v / M, 1) for k, v in s3.items() if k != "segments"},
                  "reserved by step", [round(s["optimizer_step_reserved"] / M) for s in r["phases"]],
                  r["method_detail"][:200])  # fmt: skip
        else:
            print(head, r.get("sdp_choice", ""), "alloc", round(r["truth_allocated"] / M, 1), round(r["est_allocated"] / M, 1),
                  "res", round(r["truth_reserved"] / M), round(r["est_reserved"] / M),
                  "req", round((r["truth_requested"] or 0) / M, 1), round(r["est_tensor"] / M, 1), r["method"])  # fmt: skip


if __name__ == "__main__":
    main()
