"""Can training resume from this checkpoint? Which piece sits under which key, which are absent.

Use:

    check = find_resume_roles(obj)                 # obj: the loaded checkpoint (dict, or {file: obj})
    check.roles      # RoleFound(role="optimizer", key="optimizer_state_dict", matched_by="name")
    check.missing    # ["scheduler", "rng_cuda", ...]
    optimizer_checks(obj, check, model_params)    # OptimizerCheck per optimizer state dict

Names vary between codebases, so a piece is recognised by its key (model / model_state_dict /
state_dict / net ..., optimizer / optim / optimizer_states ...) or by its shape: an optimizer
state dict has `state` and `param_groups`, a scheduler's has `last_epoch`, a GradScaler's has
`scale` and `growth_factor`; torch's CPU generator state is a uint8 tensor of 5056 bytes and a
CUDA one 16 bytes (torch.get_rng_state() / torch.cuda.get_rng_state() in torch 2.13), numpy's
legacy state a 5-tuple starting 'MT19937' (or a dict with 'bit_generator'), Python's
random.getstate() a 3-tuple holding 625 ints. Folders (Hugging Face Trainer's checkpoint-N/)
map file names to pieces: optimizer.pt, scheduler.pt, scaler.pt, rng_state*.pth,
trainer_state.json. The result says which key was taken as what.

Known limitations: a piece hidden more than three mappings deep, or under an unrecognised key
with an unrecognised shape, is reported missing.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Any, get_args

from torch_skills.checkpoint.allowlist import words
from torch_skills.checkpoint.models import (
    OptimizerCheck,
    OptimizerShapeMismatch,
    ResumeCheck,
    ResumeRole,
    RoleFound,
)
from torch_skills.checkpoint.tree import is_tensor_mapping, leaf_info, walk

RESUME_ROLES: tuple[ResumeRole, ...] = get_args(ResumeRole)

_NAMES: dict[ResumeRole, set[str]] = {
    "model": set(
        words(
            "model model_state_dict state_dict model_state net network module weights model_dict "
            "net_state_dict network_state_dict model_weights params"
        )
    ),
    "optimizer": set(
        words(
            "optimizer optimizer_state_dict optim opt optimizer_state optimizers optimizer_states "
            "optim_state_dict opt_state optim_state"
        )
    ),
    "scheduler": set(
        words(
            "scheduler lr_scheduler scheduler_state_dict sched lr_schedulers schedulers "
            "lr_scheduler_state_dict scheduler_state"
        )
    ),
    "grad_scaler": set(
        words(
            "scaler grad_scaler amp_scaler scaler_state_dict amp native_amp_scaling_state gradscaler "
            "loss_scaler"
        )
    ),
    "epoch_or_step": set(
        words(
            "epoch step global_step iteration iter epochs steps num_updates train_step current_epoch "
            "total_steps num_steps update updates batch_idx"
        )
    ),
    "sampler": set(
        words(
            "sampler sampler_state sampler_state_dict dataloader dataloader_state dataloader_state_dict "
            "data_loader train_loader data_state loader_state loops train_dataloader data_sampler"
        )
    ),
}
_NAME_TO_ROLE = {name: role for role, names in _NAMES.items() for name in names}
_RNG_CONTAINERS = set(
    words("rng rng_state rng_states random_state random_states rngs generator_states seeds")
)
_RNG_BY_NAME: dict[ResumeRole, str] = {
    "rng_torch": "torch cpu torch_rng_state cpu_rng_state torch_rng",
    "rng_cuda": "cuda cuda_rng_state cuda_rng cuda_rng_states",
    "rng_numpy": "numpy np numpy_rng_state np_rng_state numpy_rng",
    "rng_python": "python random python_rng_state py_rng_state python_rng",
}
_RNG_NAMES = {name: role for role, names in _RNG_BY_NAME.items() for name in words(names)}
_FILE_ROLES: list[tuple[re.Pattern[str], ResumeRole | None]] = [
    (
        re.compile(
            r"^(pytorch_model|model|adapter_model|diffusion_pytorch_model)([-.].*)?\.(safetensors|bin|pt|pth)$"
        ),
        "model",
    ),
    (re.compile(r"^optimizer(_\d+)?\.(pt|bin|pth)$"), "optimizer"),
    (re.compile(r"^(scheduler|lr_scheduler)\.(pt|bin|pth)$"), "scheduler"),
    (re.compile(r"^scaler\.(pt|bin|pth)$"), "grad_scaler"),
    (re.compile(r"^rng_state(_\d+)?\.(pth|pt)$"), None),  # a container of RNG states
]
TORCH_CPU_RNG_BYTES = 5056  # torch.get_rng_state().numel() (mt19937 state), torch 2.13
CUDA_RNG_BYTES = 16  # torch.cuda.get_rng_state().numel() (philox seed + offset)
PYTHON_RNG_WORDS = 625  # random.getstate()[1]: 624 mt19937 words + position
_BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")
_PER_PARAM_STATE = set(
    words(
        "exp_avg exp_avg_sq max_exp_avg_sq momentum_buffer square_avg acc_delta sum ax prev grad_avg exp_inf"
    )
)


def looks_like_optimizer(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and "state" in value
        and isinstance(value.get("param_groups"), (list, tuple))
        and all(isinstance(g, Mapping) for g in value["param_groups"])
    )


def looks_like_scheduler(value: Any) -> bool:
    return isinstance(value, Mapping) and "last_epoch" in value


def looks_like_scaler(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and "scale" in value
        and ("growth_factor" in value or "_growth_tracker" in value)
    )


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    info = leaf_info(value)
    return info is not None and info.shape == ()


def _contains_tensors(value: Any) -> bool:
    return any(True for _ in walk(value, max_depth=4, max_nodes=10_000))


def _many(value: Any, test) -> bool:
    if test(value):
        return True
    if isinstance(value, (list, tuple)) and value and all(test(v) for v in value):
        return True
    return isinstance(value, Mapping) and bool(value) and all(test(v) for v in value.values())


def rng_role(key: str, value: Any) -> tuple[ResumeRole, str] | None:
    """(which RNG state `value` is, "structure" or "name"), from its shape first and its key second."""
    lowered = key.lower()
    info = leaf_info(value)
    if info is not None and info.dtype == "uint8" and len(info.shape) == 1:
        if info.shape[0] == TORCH_CPU_RNG_BYTES:
            return "rng_torch", "structure"
        if info.shape[0] == CUDA_RNG_BYTES:
            return "rng_cuda", "structure"
    if isinstance(value, (list, tuple)):
        if len(value) == 5 and value[0] == "MT19937":
            return "rng_numpy", "structure"
        if (
            len(value) == 3
            and isinstance(value[0], int)
            and isinstance(value[1], tuple)
            and len(value[1]) == PYTHON_RNG_WORDS
        ):
            return "rng_python", "structure"
    if isinstance(value, Mapping) and "bit_generator" in value and "state" in value:
        return "rng_numpy", "structure"
    by_name = _RNG_NAMES.get(lowered)
    if by_name is not None and (info is not None or isinstance(value, (list, tuple))):
        return by_name, "name"
    return None


def _name_role(key: str, value: Any) -> ResumeRole | None:
    role = _NAME_TO_ROLE.get(key.lower())
    if role == "model" and not (
        is_tensor_mapping(value) or (isinstance(value, Mapping) and _contains_tensors(value))
    ):
        return None
    if role == "optimizer" and not _many(value, looks_like_optimizer):
        return None
    if role == "scheduler" and not _many(value, looks_like_scheduler):
        return None
    if role == "grad_scaler" and not (isinstance(value, Mapping) and (not value or looks_like_scaler(value))):
        return None
    if role == "epoch_or_step" and not _is_number(value):
        return None
    return role


def _structure_role(value: Any) -> ResumeRole | None:
    if _many(value, looks_like_optimizer):
        return "optimizer"
    if _many(value, looks_like_scheduler):
        return "scheduler"
    if looks_like_scaler(value):
        return "grad_scaler"
    if is_tensor_mapping(value):
        return "model"
    return None


def file_role(name: str) -> tuple[bool, ResumeRole | None]:
    """(whether the name is a known checkpoint-folder file, the piece it holds or None for an RNG container)."""
    for pattern, role in _FILE_ROLES:
        if pattern.match(name):
            return True, role
    return False, None


def find_resume_roles(obj: Any, *, folder: bool = False) -> ResumeCheck:
    """Locate each resume piece in a loaded checkpoint (`folder`: obj maps file names to contents)."""
    found: dict[ResumeRole, RoleFound] = {}
    notes: list[str] = []

    def claim(role: ResumeRole, key: str, how: str) -> None:
        if role not in found:
            found[role] = RoleFound(role=role, key=key, matched_by=how)

    if is_tensor_mapping(obj) and not folder:
        claim("model", "(the whole file)", "structure")
        return _finish(found, notes, weights_only_file=True)

    queue: deque[tuple[str, str, Any, int]] = deque()
    if isinstance(obj, Mapping):
        queue.extend((str(k), str(k), v, 1) for k, v in obj.items())
    while queue:
        path, key, value, depth = queue.popleft()
        if folder and depth == 1:
            matched, role = file_role(key)
            if key == "trainer_state.json" and isinstance(value, Mapping):
                for counter in ("global_step", "epoch"):
                    if _is_number(value.get(counter)):
                        claim("epoch_or_step", f"{key}:{counter}", "file")
                        break
                continue
            if matched and role is not None:
                claim(role, key, "file")
                continue
            if matched:  # rng_state.pth: look inside
                queue.extend((f"{path}.{k}", str(k), v, depth + 1) for k, v in _items(value))
                continue
        rng = rng_role(key, value)
        if rng is not None:
            claim(rng[0], path, rng[1])
            continue
        role = _name_role(key, value)
        how = "name"
        if role is None and not (folder and depth == 1):
            role, how = _structure_role(value), "structure"
        if role is not None:
            if role == "model" and how == "structure" and "model" in found:
                continue
            claim(role, path, how)
            continue
        if (
            depth < 3
            and isinstance(value, (Mapping, list, tuple))
            and (isinstance(value, Mapping) or key.lower() in _RNG_CONTAINERS)
        ):
            queue.extend((f"{path}.{k}", str(k), v, depth + 1) for k, v in _items(value))
    if "sampler" in found and found["sampler"].key.split(".")[-1] == "loops":
        notes.append(
            "Lightning's `loops` progress is taken as the data position; it skips seen batches on resume"
        )
    return _finish(found, notes, weights_only_file=False)


def _items(value: Any) -> list[tuple[Any, Any]]:
    if isinstance(value, Mapping):
        return list(value.items())
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    return []


def _finish(found: dict[ResumeRole, RoleFound], notes: list[str], weights_only_file: bool) -> ResumeCheck:
    training = "optimizer" in found or "epoch_or_step" in found
    if training:
        kind = "training"
    elif "model" in found:
        kind = "weights_only"
    else:
        kind = "unknown"
    if weights_only_file:
        notes.append("the file is a bare state dict: weights only, nothing to resume training from")
    missing = [r for r in RESUME_ROLES if r not in found]
    return ResumeCheck(kind=kind, roles=list(found.values()), missing=missing, notes=notes)


def get_path(obj: Any, path: str) -> Any:
    """The value at a dotted path produced by `find_resume_roles` (list indices as numbers)."""
    if path == "(the whole file)":
        return obj
    current = obj
    for part in path.split("."):
        if isinstance(current, Mapping):
            if part in current:
                current = current[part]
            else:
                current = next((v for k, v in current.items() if str(k) == part), None)
        elif isinstance(current, (list, tuple)) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return None
    return current


def model_tensor_estimate(model_state: Any) -> int | None:
    """Tensors in a model state dict minus well-known buffers: an upper bound on its parameters."""
    if not isinstance(model_state, Mapping):
        return None
    return sum(1 for path, _ in walk(model_state) if not path.split(".")[-1].endswith(_BUFFER_SUFFIXES))


def optimizer_checks(
    obj: Any,
    resume: ResumeCheck,
    model_params: list[tuple[str, tuple[int, ...]]] | None,
    max_listed: int = 50,
) -> list[OptimizerCheck]:
    """Consistency of each optimizer state dict: groups vs state vs the model's parameters."""
    role = next((r for r in resume.roles if r.role == "optimizer"), None)
    if role is None:
        return []
    value = get_path(obj, role.key)
    model_role = next((r for r in resume.roles if r.role == "model"), None)
    estimate = None
    if model_role is not None and model_role.matched_by != "file":
        estimate = model_tensor_estimate(get_path(obj, model_role.key))
    if looks_like_optimizer(value):
        states = [(role.key, value)]
    elif isinstance(value, Mapping):
        states = [(f"{role.key}.{k}", v) for k, v in value.items() if looks_like_optimizer(v)]
    elif isinstance(value, (list, tuple)):
        states = [(f"{role.key}.{i}", v) for i, v in enumerate(value) if looks_like_optimizer(v)]
    else:
        states = []
    single = len(states) == 1
    return [
        _check_one(key, osd, model_params if single else None, estimate, max_listed) for key, osd in states
    ]


def _check_one(
    key: str,
    osd: Mapping,
    model_params: list[tuple[str, tuple[int, ...]]] | None,
    estimate: int | None,
    max_listed: int,
) -> OptimizerCheck:
    groups: Sequence[Mapping] = osd["param_groups"]
    ids = [p for g in groups for p in (g.get("params") or [])]
    id_keys = [str(p) for p in ids]
    state = osd.get("state") if isinstance(osd.get("state"), Mapping) else {}
    state_keys = {str(k): v for k, v in state.items()}
    duplicates = [k for k, n in Counter(id_keys).items() if n > 1]
    orphans = [k for k in state_keys if k not in set(id_keys)]
    without_state = sum(1 for k in id_keys if k not in state_keys)
    problems: list[str] = []
    if duplicates:
        problems.append(
            f"{len(duplicates)} parameter ids appear in more than one param group (e.g. {duplicates[0]}); "
            "torch.optim refuses that on load"
        )
    if orphans:
        problems.append(
            f"{len(orphans)} state entries belong to no param group (e.g. {orphans[0]}); load_state_dict "
            "will drop or misplace them"
        )
    mismatches: list[OptimizerShapeMismatch] = []
    if model_params is not None:
        if len(model_params) != len(ids):
            problems.append(
                f"the optimizer holds {len(ids)} parameters but the model has {len(model_params)}: it was "
                "built over a different model or parameter subset, and load_state_dict will fail or misassign state"
            )
        else:
            for index, (param_key, (name, shape)) in enumerate(zip(id_keys, model_params, strict=False)):
                entry = state_keys.get(param_key)
                if not isinstance(entry, Mapping):
                    continue
                for state_key, tensor in entry.items():
                    info = leaf_info(tensor)
                    if state_key not in _PER_PARAM_STATE or info is None or tuple(info.shape) == tuple(shape):
                        continue
                    if len(mismatches) < max_listed:
                        mismatches.append(
                            OptimizerShapeMismatch(
                                index=index,
                                parameter=name,
                                state_key=state_key,
                                state_shape=list(info.shape),
                                parameter_shape=list(shape),
                            )
                        )
            if mismatches:
                problems.append(
                    f"{len(mismatches)} optimizer state tensors do not match the shape of the model parameter at "
                    f"the same position (first: #{mismatches[0].index} {mismatches[0].parameter}); the parameter "
                    "order or the model changed since the checkpoint was written"
                )
    elif estimate is not None and len(ids) > estimate:
        problems.append(
            f"the optimizer holds {len(ids)} parameters but the checkpoint's model has only {estimate} tensors "
            "(buffers excluded); they cannot belong together"
        )
    return OptimizerCheck(
        key=key,
        param_groups=len(groups),
        params_in_groups=len(ids),
        state_entries=len(state_keys),
        params_without_state=without_state,
        state_not_in_groups=len(orphans),
        duplicate_params=len(duplicates),
        model_parameters=len(model_params) if model_params is not None else None,
        checkpoint_model_tensors=estimate,
        shape_mismatches=mismatches,
        consistent=not problems,
        problems=problems,
    )
