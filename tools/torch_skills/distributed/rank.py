"""What one rank runs: a process group, the user's model wrapped as asked, the steps, observations.

`rank_main(plan, rank)` is called in a process forked by `torch_skills.distributed.launch`; it never
returns. Everything it learns goes to files in `plan.dir` (see `RankFiles`), written as it goes, so
the supervisor can still read what a rank did when the rank crashes or hangs:

    rank{r}.status        the phase it is in ("step 2 backward"), rewritten at each phase
    rank{r}.calls.jsonl   one line per collective, before the call (comms.Recorder)
    rank{r}.result.json   per-step figures, parameter usage, data observations (at the end)
    rank{r}.error.json    its exception and traceback, when it raises
    rank{r}.state{s}.pt   per-tensor digests and samples after step s (replica comparison)
    rank{r}.probe.pt      its local batch and (rank 0 for ddp, every rank for fsdp) the gradients
                          of the probe step, for the single-process comparison

The probe step runs first, in eval mode (dropout off, BatchNorm on running statistics) so the
gradient comparison is deterministic; its gradients are discarded before the training steps.
"""

from __future__ import annotations

import datetime
import faulthandler
import hashlib
import inspect
import json
import os
import resource
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torch_skills.distributed.comms import Recorder, ddp_counting_hook
from torch_skills.distributed.models import DistributedRequest
from torch_skills.runner.errors import UserCodeError
from torch_skills.runner.usercode import (
    build_model,
    compute_loss,
    describe_rule,
    load_callable,
    make_batch,
    split_batch,
    to_device,
    user_code,
)

DUMP_SIGNAL = signal.SIGUSR1  # the supervisor sends it before killing a rank: its stack goes to fault.txt
SAMPLE = 4096  # elements kept per tensor for the cross-rank difference (all of smaller tensors)
MAX_INDICES = 1_000_000  # sampler indices read per epoch at most


@dataclass
class Plan:
    """What every rank needs; built by the worker before the fork."""

    request: DistributedRequest
    dir: Path  # the job's folder for rank files and the FileStore
    cwd: Path
    roots: list[Path]
    device: str  # "cpu" | "cuda"
    threads: int = 1  # torch intra-op threads per rank (worker.rank_threads)

    def path(self, rank: int, name: str) -> Path:
        return self.dir / f"rank{rank}.{name}"


def _status(plan: Plan, rank: int, phase: str) -> None:
    tmp = plan.path(rank, "status.tmp")
    tmp.write_text(phase)
    os.replace(tmp, plan.path(rank, "status"))


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def rank_main(plan: Plan, rank: int) -> None:
    """Entry point after fork; exits the process."""
    code = 0
    try:
        _die_with_parent()
        fault = open(plan.path(rank, "fault.txt"), "w")  # noqa: SIM115 - open until the rank exits
        faulthandler.enable(file=fault)  # a crash leaves the rank's Python stack for the supervisor
        faulthandler.register(DUMP_SIGNAL, file=fault)  # ...and so does a hang, before the kill
        torch.set_num_threads(plan.threads)  # world_size ranks share the machine's cores
        Rank(plan, rank).run()
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the supervisor
        code = 1
        try:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            _write_json(
                plan.path(rank, "error.json"),
                {
                    "type": type(cause).__name__,
                    "kind": getattr(exc, "kind", None),  # a UserCodeError's kind
                    "message": str(exc)[:2000],
                    "where": user_frame(cause),
                    "traceback": "".join(traceback.format_exception(exc))[-4000:],
                },
            )
        except BaseException:  # noqa: BLE001
            code = 2
    finally:
        os._exit(code)


def user_frame(exc: BaseException) -> str | None:
    """'file.py:42' of the innermost traceback frame outside the standard library, site-packages and
    torch_skills: where the user's code raised."""
    import sysconfig

    from torch_skills import OWN_DIRS

    library = tuple(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    where = None
    for frame in traceback.extract_tb(exc.__traceback__):
        name = frame.filename
        if name.startswith("<") or name.startswith(OWN_DIRS) or name.startswith(library):
            continue
        where = f"{name}:{frame.lineno}"
    return where


def shard_batch(batch: Any, rank: int, world: int) -> Any:
    """Rank `rank`'s rows of a global batch: every tensor is cut along dim 0 into `world` equal parts."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            return batch
        if batch.shape[0] % world:
            raise ValueError(
                f"the batch has {batch.shape[0]} rows, not a multiple of world_size={world}; "
                f"give input_shape[0] (or make_inputs' batch) a multiple of {world}"
            )
        return batch.chunk(world)[rank].clone()
    if isinstance(batch, dict):
        return {k: shard_batch(v, rank, world) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(shard_batch(v, rank, world) for v in batch)
    return batch


def _leaves(loss: torch.Tensor) -> set[int]:
    """ids of the leaf tensors (AccumulateGrad variables) whose values the loss depends on.

    DDP passes every forward output through one autograd node (_DDPSink, with
    find_unused_parameters=True); backward sends zeros into the outputs the loss never used, so
    parameters behind them look used. Through that node only the outputs the loss reached count,
    which is what plain DDP sees."""
    found: set[int] = set()
    seen: set[Any] = set()
    sinks: dict[Any, set[int]] = {}  # sink node -> the outputs of it the loss reached
    expanded: dict[Any, set[int]] = {}
    stack = [loss.grad_fn] if loss.grad_fn is not None else []
    while stack:
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            variable = getattr(node, "variable", None)
            if variable is not None:
                found.add(id(variable))
            for child, index in node.next_functions:
                if child is None:
                    continue
                if type(child).__name__ == "_DDPSinkBackward":
                    sinks.setdefault(child, set()).add(index)
                else:
                    stack.append(child)
        for sink, outputs in sinks.items():
            new = outputs - expanded.setdefault(sink, set())
            expanded[sink] |= new
            stack += [sink.next_functions[i][0] for i in new if i < len(sink.next_functions)]
    return found


def _digest(t: torch.Tensor) -> tuple[str, torch.Tensor]:
    """(exact hash of the bytes, up to SAMPLE evenly spaced elements as float64)."""
    t = t.to_local() if hasattr(t, "to_local") else t  # an FSDP2 shard: this rank's piece
    raw = t.detach().reshape(-1).cpu().contiguous()
    digest = hashlib.blake2b(raw.view(torch.uint8).numpy().tobytes(), digest_size=16).hexdigest()
    stride = max(1, raw.numel() // SAMPLE)
    return digest, raw[::stride][:SAMPLE].double()


def _rss() -> tuple[int, int]:
    """(current, peak) resident bytes of this process."""
    current = peak = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    current = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return current, peak


class Rank:
    def __init__(self, plan: Plan, rank: int):
        self.plan = plan
        self.rank = rank
        self.request = plan.request
        self.world = plan.request.world_size
        self.result: dict[str, Any] = {"rank": rank, "steps": [], "usage": [], "data": None}

    def status(self, phase: str) -> None:
        _status(self.plan, self.rank, phase)

    # -- set-up ----------------------------------------------------------------------------------
    def init_group(self) -> torch.device:
        self.status("joining the process group")
        if self.plan.device == "cuda":
            local = self.rank % torch.cuda.device_count()
            torch.cuda.set_device(local)
            device, backend = torch.device("cuda", local), "nccl"
        else:
            device, backend = torch.device("cpu"), "gloo"
        store = dist.FileStore(str(self.plan.dir / "store"), self.world)  # private to this job
        dist.init_process_group(
            backend,
            store=store,
            rank=self.rank,
            world_size=self.world,
            timeout=datetime.timedelta(seconds=self.request.hang_timeout_s),
        )
        return device

    def wrap(self, model: nn.Module, device: torch.device, recorder: Recorder) -> nn.Module:
        self.status(f"wrapping the model ({self.request.strategy})")
        if self.request.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            with user_code("wrapping the model in DistributedDataParallel"):
                ddp = DDP(
                    model,
                    device_ids=[device.index] if device.type == "cuda" else None,
                    find_unused_parameters=True,  # so a model with unused parameters still runs every step
                )
            ddp.register_comm_hook(recorder, ddp_counting_hook)
            return ddp
        from torch.distributed.fsdp import fully_shard

        with user_code("sharding the model with fully_shard"):
            for module in list(model.modules()):
                if isinstance(module, nn.ModuleList):
                    for block in module:
                        if any(p.requires_grad for p in block.parameters()):
                            fully_shard(block)
            fully_shard(model)
        return model

    # -- data ------------------------------------------------------------------------------------
    def batches(self, device: torch.device):
        """Yield this rank's batches: its share of the global batch, or its loader's batches."""
        request = self.request
        if request.data is None:
            torch.manual_seed(request.seed)  # the same global batch on every rank
            global_batch = make_batch(request, self.plan.cwd, self.plan.roots)
            try:
                local = shard_batch(global_batch, self.rank, self.world)
            except ValueError as e:
                raise UserCodeError("bad_request", str(e)) from None
            while True:
                yield to_device(local, device)
        factory = load_callable(
            request.data, self.plan.cwd, self.plan.roots, "the data loader factory", role="data"
        )
        kwargs = {}
        try:
            params = inspect.signature(factory).parameters
        except (TypeError, ValueError):
            params = {}
        for name, value in (("rank", self.rank), ("world_size", self.world)):
            if name in params:
                kwargs[name] = value
        with user_code(f"calling the data loader factory {request.data}"):
            loader = factory(**kwargs)
        self.result["data"] = observe_loader(loader)
        fingerprints: list[str] = []
        self.result["data"]["fingerprints"] = fingerprints
        while True:
            produced = False
            with user_code("iterating the data loader"):
                iterator = iter(loader)
            while True:
                with user_code("iterating the data loader"):
                    batch = next(iterator, None)
                if batch is None:
                    break
                produced = True
                fingerprints += _row_hashes(batch)
                yield to_device(batch, device)
            if not produced:
                raise UserCodeError("bad_request", f"{request.data} gave rank {self.rank} no batch at all")

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> None:
        device = self.init_group()
        recorder = Recorder(str(self.plan.path(self.rank, "calls.jsonl")))
        start_rss, _ = _rss()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with recorder.installed():
            self.status("building the model")
            torch.manual_seed(self.request.seed)
            inner = build_model(self.request, self.plan.cwd, self.plan.roots, device)
            self.names = {id(p): n for n, p in inner.named_parameters()}
            self.qualnames = {id(m): n for n, m in inner.named_modules()}
            self.result["frozen"] = [n for n, p in inner.named_parameters() if not p.requires_grad]
            self.result["batchnorm"] = [
                n
                for n, m in inner.named_modules()
                if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm)
            ]
            batches = self.batches(device)
            model = self.wrap(inner, device, recorder)
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
            self.probe(model, inner, next(batches))
            optimizer.zero_grad(set_to_none=True)
            for step in range(1, self.request.steps + 1):
                recorder.step = step
                self.train_step(step, model, inner, optimizer, next(batches), recorder)
            self.result["buckets"] = [
                {**b, "names": [self.names.get(i, "?") for i in b["names"]][:5]} for b in recorder.buckets
            ]
            recorder.step = self.request.steps + 1
        self.result["sites"] = _module_sites(inner, self.result["usage"])
        self.result["forward_sites"] = _forward_sites(
            inner, {n for u in self.result["usage"] for n in u["changed_outside_autograd"]}
        )
        _, peak = _rss()
        if device.type == "cuda":
            self.result["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(device))
        else:
            self.result["peak_memory_bytes"] = max(0, peak - start_rss)
        self.status("finished")
        _write_json(self.plan.path(self.rank, "result.json"), self.result)
        # No destroy_process_group(): rank_main ends the process with os._exit right after, every
        # collective has completed, and tearing the group down can stall on the shared FileStore
        # (the last rank out deletes it while a peer's threads still read it).

    def loss_of(self, inner: nn.Module, output: Any, batch: Any) -> tuple[torch.Tensor, str]:
        return compute_loss(self.request, self.plan.cwd, self.plan.roots, output, batch, inner)

    def forward(self, model: nn.Module, inner: nn.Module, batch: Any, what: str) -> tuple[Any, torch.Tensor]:
        split = split_batch(inner, batch)
        with user_code(f"{what}: the forward pass"):
            output = model(*split.args, **split.kwargs)
        with user_code(f"{what}: the loss"):
            loss, how = self.loss_of(inner, output, batch)
        self.result["batch_rule"] = describe_rule(inner, batch, how).model_dump()
        return output, loss

    def probe(self, model: nn.Module, inner: nn.Module, batch: Any) -> None:
        """One forward/backward in eval mode; save the batch and the distributed gradient."""
        self.status("probe step forward")
        model.eval()
        _, loss = self.forward(model, inner, batch, "the probe step")
        self.status("probe step backward")
        with user_code("the probe step: backward"):
            loss.backward()
        model.train()
        grads: dict[str, torch.Tensor] = {}
        if self.request.strategy == "fsdp" or self.rank == 0:
            for name, p in inner.named_parameters():
                if p.grad is not None:
                    g = p.grad
                    grads[name] = (g.to_local() if hasattr(g, "to_local") else g).detach().cpu()
        torch.save({"batch": to_device(batch, "cpu"), "grads": grads}, self.plan.path(self.rank, "probe.pt"))

    def train_step(self, step, model, inner, optimizer, batch, recorder) -> None:
        started = time.perf_counter()
        before = {n: _digest(p)[0] for n, p in inner.named_parameters()}
        self.status(f"step {step} forward")
        _, loss = self.forward(model, inner, batch, f"step {step}")
        names = self.names
        if self.request.strategy == "fsdp":  # the graph reaches FSDP2's unsharded parameters
            names = {**names, **_fsdp_unsharded_names(inner, self.qualnames)}
        used = _leaves(loss)
        trainable = [n for n, p in inner.named_parameters() if p.requires_grad]
        self.status(f"step {step} backward")
        with user_code(f"step {step}: backward"):
            loss.backward()
        changed_in_step = [n for n, p in inner.named_parameters() if _digest(p)[0] != before[n]]
        self.status(f"step {step} optimizer")
        with user_code(f"step {step}: optimizer step"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        reached = {names[i] for i in used if i in names}
        self.result["usage"].append(
            {
                "step": step,
                "unused": [n for n in trainable if n not in reached],
                "changed_outside_autograd": changed_in_step,
            }
        )
        self.result["steps"].append(
            {
                "step": step,
                "loss": float(loss.detach().float().item()),
                "seconds": time.perf_counter() - started,
                "collectives": {k: {"count": c, "bytes": b} for k, (c, b) in recorder.counts(step).items()},
            }
        )
        state = {}
        for n, p in inner.named_parameters():
            if hasattr(p, "to_local"):
                continue  # an FSDP shard: each rank holds a different piece by design
            state["param:" + n] = _digest(p)
        for n, b in inner.named_buffers():
            state["buffer:" + n] = _digest(b)
        torch.save(state, self.plan.path(self.rank, f"state{step}.pt"))


def _module_sites(model: nn.Module, usage: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """For each parameter some step did not use: its module's class, file:line, and its bytes."""

    names = {n for u in usage for n in u["unused"]}
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    sites: dict[str, dict[str, Any]] = {}
    for name in names:
        owner = name.rsplit(".", 1)[0] if "." in name else ""
        module = modules.get(owner)
        p = params.get(name)
        sites[name] = {
            "module": owner,
            "module_type": type(module).__name__ if module is not None else None,
            "where": _assigned_at(modules, owner),
            "bytes": p.numel() * p.element_size() if p is not None else 0,
        }
    return sites


def _forward_sites(model: nn.Module, names: set[str]) -> dict[str, str]:
    """name -> 'file.py:line' of the forward of the module that owns the parameter."""
    modules = dict(model.named_modules())
    sites = {}
    for name in names:
        owner = modules.get(name.rsplit(".", 1)[0] if "." in name else "")
        try:
            forward = type(owner).forward
            sites[name] = f"{inspect.getsourcefile(forward)}:{inspect.getsourcelines(forward)[1]}"
        except (TypeError, OSError, AttributeError):
            continue
    return sites


def _assigned_at(modules: dict[str, nn.Module], owner: str) -> str | None:
    """'file.py:line' where the parent module assigns `owner` (self.<attr> = ...), else its class line."""
    import re

    parent_name, _, attr = owner.rpartition(".")
    parent = modules.get(parent_name)
    if parent is None or not attr:
        return None
    cls = type(parent)
    try:
        lines, first = inspect.getsourcelines(cls)
        path = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return None
    pattern = re.compile(rf"self\.{re.escape(attr)}\s*(:[^=]*)?=")
    for offset, line in enumerate(lines):
        if pattern.search(line):
            return f"{path}:{first + offset}"
    return f"{path}:{first}"


def _fsdp_unsharded_names(model: nn.Module, qualnames: dict[int, str]) -> dict[int, str]:
    """id(unsharded parameter) -> name, for the FSDP2 parameters the forward's graph holds."""
    found: dict[int, str] = {}
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        group = getattr(get_state(), "_fsdp_param_group", None) if get_state else None
        for fsdp_param in getattr(group, "fsdp_params", ()):
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            info = fsdp_param._module_info
            prefix = qualnames.get(id(info.module), "")
            if unsharded is not None:
                found[id(unsharded)] = f"{prefix}.{info.param_name}" if prefix else info.param_name
    return found


def _row_hashes(batch: Any) -> list[str]:
    """One short hash per sample (row of the first tensor in the batch)."""
    first = None
    stack = [batch]
    while stack and first is None:
        item = stack.pop(0)
        if isinstance(item, torch.Tensor) and item.dim() >= 1:
            first = item
        elif isinstance(item, dict):
            stack += list(item.values())
        elif isinstance(item, (list, tuple)):
            stack += list(item)
    if first is None:
        return []
    rows = first.detach().cpu().contiguous()
    return [
        hashlib.blake2b(r.contiguous().view(torch.uint8).numpy().tobytes(), digest_size=8).hexdigest()
        for r in rows
    ]


def observe_loader(loader: Any) -> dict[str, Any]:
    """Sampler indices of two epochs (without set_epoch, then with set_epoch(1)), and the batch count."""
    sampler = getattr(loader, "sampler", None)
    info: dict[str, Any] = {
        "loader": type(loader).__name__,
        "sampler": type(sampler).__name__ if sampler is not None else None,
        "batches": None,
        "indices": None,
        "repeat_without_set_epoch": None,
        "set_epoch_changes_order": None,
        "shuffled": None,
    }
    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is None:
        try:
            info["batches"] = len(loader)
        except TypeError:
            pass
        return info

    def epoch() -> list[int]:
        flat: list[int] = []
        with user_code("iterating the loader's sampler"):
            for batch in batch_sampler:
                flat += [int(i) for i in batch] if isinstance(batch, (list, tuple)) else [int(batch)]
                if len(flat) >= MAX_INDICES:
                    break
        return flat

    with user_code("iterating the loader's sampler"):
        info["batches"] = len(batch_sampler)
    first = epoch()
    second = epoch()
    info["indices"] = first
    info["shuffled"] = first != sorted(first) or bool(getattr(sampler, "shuffle", False))
    info["repeat_without_set_epoch"] = first == second
    set_epoch = getattr(sampler, "set_epoch", None)
    if callable(set_epoch) and first == second:
        with user_code("calling the sampler's set_epoch"):
            set_epoch(1)
            info["set_epoch_changes_order"] = epoch() != first
            set_epoch(0)
    return info
