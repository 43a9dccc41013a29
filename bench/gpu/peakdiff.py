"""Op-by-op comparison of a real CUDA step and estimate_memory's fake trace: where the bytes part ways.

Run (CUDA device; same requirements as bench/gpu_check.py):

    python bench/gpu/peakdiff.py --out /tmp/gpu       # about 60 s on one H100; writes OUT/peakdiff.json

For each case, in a fresh process: two real warm-up steps, then a third under a dispatch mode that
records, after every aten op, the allocator's exact `requested_bytes` (current) and the op's own
in-op peak above that; then the tool's fake trace (`_Tracer.trace`), whose ledger gives the live
storage bytes after every op. Ops are aligned per phase by name (difflib; `detach`, which the ledger's
saved-tensor unpacking adds, is dropped); the report lists where (real - estimate) changes and
every op whose in-op peak exceeds 1 MiB (scratch the trace does not see).
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("gpu_check", HERE.parent / "gpu_check.py")
gc_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gc_mod)

CASES = [
    ("vit_small", "train", "bf16", None),
    ("vit_small", "train", "fp32", None),
    ("encoder_torch", "train", "fp32", None),
    ("encoder_torch", "train", "bf16", None),
    ("hf_bert", "train", "bf16", None),
    ("gpt_medium", "train", "bf16_autocast", "GPTBlock"),
]


def real_timeline(tracer, spec, batch_size) -> list[tuple[str, str, int, int]]:
    """(phase, op, requested bytes after the op, in-op peak above the bytes before it) for step 3."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from torch_skills.memory.groundtruth import _prepare
    from torch_skills.memory.trace import (
        AUTOCAST,
        LOW_PRECISION,
        call_model,
        convert_tensors,
        make_optimizer,
        wrap_checkpointing,
    )

    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = tracer.build()
    low = LOW_PRECISION.get(spec.precision)
    convert_tensors(model, dev, low)
    wrap_checkpointing(model, spec.checkpoint_classes)
    model.train()
    batch = _prepare(tracer.batch(batch_size), dev, low)
    opt = make_optimizer(model, spec)
    auto = (
        (lambda: torch.autocast("cuda", dtype=AUTOCAST[spec.precision]))
        if spec.precision in AUTOCAST
        else contextlib.nullcontext
    )
    rows: list = []
    state = {"phase": "forward"}

    class Timeline(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = torch.cuda.memory_stats()["requested_bytes.all.current"]
            torch.cuda.reset_peak_memory_stats()
            out = func(*args, **(kwargs or {}))
            stats = torch.cuda.memory_stats()
            rows.append((state["phase"], str(func.overloadpacket.__name__), stats["requested_bytes.all.current"],
                         stats["requested_bytes.all.peak"] - max(before, stats["requested_bytes.all.current"])))  # fmt: skip
            return out

    def step(record: bool) -> None:
        mode = Timeline() if record else contextlib.nullcontext()
        with mode:
            state["phase"] = "forward"
            with auto():
                out = call_model(model, batch)
                loss = tracer.loss(out, batch)
            state["phase"] = "backward"
            loss.backward()
            state["phase"] = "optimizer_step"
            opt.step()
            opt.zero_grad(set_to_none=True)
            del out, loss

    for i in range(3):
        step(record=i == 2)
    return rows


def est_timeline(trace) -> list[tuple[str, str, int]]:
    live = 0
    rows = []
    for tag, item in trace.events:
        if tag == "alloc":
            live += item.nbytes
        elif tag == "free":
            live -= item.nbytes
        elif tag == "op":
            rows.append((item.phase, item.op, live))
    return rows


def compare(real: list, est: list, phase: str) -> dict:
    """Align the two op sequences of `phase` and say where their live bytes differ.

    `detach` ops (the ledger's saved-tensor unpacking adds many) and ops only one side has are
    dropped; the rest is aligned with difflib. The estimate's bytes exclude the cuBLAS workspaces it
    adds later, so a constant difference of the workspace size means the tensors agree."""
    import difflib

    r = [x for x in real if x[0] == phase and x[1] != "detach"]
    names = {x[1] for x in r}
    e = [x for x in est if x[0] == phase and x[1] in names]
    match = difflib.SequenceMatcher(None, [x[1] for x in r], [x[1] for x in e], autojunk=False)
    pairs = [(a + k, b + k) for a, b, n in match.get_matching_blocks() for k in range(n)]
    diffs = [r[i][2] - e[j][2] for i, j in pairs]
    jumps = [
        (r[i][1], i, diffs[k] - diffs[k - 1])
        for k, (i, _) in enumerate(pairs)
        if k and abs(diffs[k] - diffs[k - 1]) > 2**20
    ]
    peak = max(range(len(r)), key=lambda i: r[i][2] + r[i][3]) if r else None
    scratch = [(r[i][1], i, r[i][3]) for i in range(len(r)) if r[i][3] > 2**20]
    return {
        "real_ops": len(r), "aligned_ops": len(pairs),
        "diff_min": min(diffs, default=None), "diff_max": max(diffs, default=None),
        "diff_end": diffs[-1] if diffs else None,
        "jumps": jumps[:40],  # (real op, index, change of real - estimate in bytes)
        "real_peak": (r[peak][1], peak, r[peak][2], r[peak][3]) if r else None,  # op, index, bytes after, in-op
        "real_in_op_scratch": scratch[:60],  # (op, index, bytes above max(before, after)) over 1 MiB
    }  # fmt: skip


def run_one(case: dict, raw: bool = False) -> dict:
    import torch

    from torch_skills.memory.models import EstimateMemoryRequest
    from torch_skills.memory.trace import StepSpec
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
    real = real_timeline(tracer, spec, case["batch_size"])
    tracer.model = None
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    est = est_timeline(tracer.trace(case["batch_size"]))
    out = {
        "case": case,
        "phases": {p: compare(real, est, p) for p in ("forward", "backward", "optimizer_step")},
    }
    if raw:
        out.update(real_rows=real, est_rows=est)
    return out


def print_report(results: list[dict]) -> None:
    M = 2**20
    for r in results:
        c = r["case"]
        print("==", c["name"], c["mode"], c["precision"], c["ac"])
        if "error" in r:
            print("ERROR", r["error"][-600:])
            continue
        for phase, p in r["phases"].items():
            mib = lambda b: None if b is None else round(b / M, 1)  # noqa: E731
            print(f"  {phase}: {p['aligned_ops']}/{p['real_ops']} ops aligned; real - estimate MiB min {mib(p['diff_min'])} "
                  f"max {mib(p['diff_max'])} end {mib(p['diff_end'])}; real peak {p['real_peak'] and (p['real_peak'][0], p['real_peak'][1], mib(p['real_peak'][2]), mib(p['real_peak'][3]))}")  # fmt: skip
            print("    jumps:", [(op, i, mib(j)) for op, i, j in p["jumps"][:12]])
            print("    in-op scratch:", [(op, i, mib(b)) for op, i, b in p["real_in_op_scratch"][:12]])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu"))
    ap.add_argument("--case")
    ap.add_argument("--raw", action="store_true", help="keep both op timelines in the JSON")
    args = ap.parse_args()
    gc_mod.ensure_pydantic()
    gc_mod.setup_path()
    if args.case:
        print(json.dumps(run_one(json.loads(args.case), args.raw), default=str), flush=True)
        return
    from diagnose import find_case  # noqa: PLC0415

    env = dict(os.environ, OMP_NUM_THREADS="2", TORCH_SKILLS_NO_PREWARM="1")

    def one(case: dict) -> dict:
        try:
            cmd = [sys.executable, __file__, "--case", json.dumps(case)] + (["--raw"] if args.raw else [])
            p = subprocess.run(cmd, capture_output=True, text=True,
                               timeout=100, env=env, cwd=gc_mod.REPO)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"case": case, "error": "timeout"}
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else {"case": case, "error": (p.stderr or p.stdout)[-1500:]}

    with cf.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, [find_case(*c) for c in CASES]))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "peakdiff.json").write_text(json.dumps(results, indent=1, default=str))
    print_report(results)


if __name__ == "__main__":
    main()
