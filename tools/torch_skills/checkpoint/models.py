"""Request and result schemas of verify_checkpoint (imported by the server: no torch here).

Use `VerifyCheckpointRequest(path="ckpt.pt")`, optionally with `model="net.py:build"` (and
`input_shape` or `inputs` for `load_and_run`); the worker returns a `VerifyCheckpointResult`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from torch_skills.results import BatchRule, Finding, RunInfo
from torch_skills.userspec import ModelInputs

CheckpointFormat = Literal[
    "torch_zip",  # torch.save (zip, torch >= 1.6): .pt .pth .ckpt .bin
    "torch_legacy",  # torch.save(_use_new_zipfile_serialization=False): five pickles + raw storages
    "torchscript",  # torch.jit.save archive
    "pickle",  # a plain pickle stream
    "safetensors",
    "safetensors_sharded",  # *.safetensors.index.json and its shards
    "dcp",  # torch.distributed.checkpoint folder: .metadata + *.distcp
    "huggingface",  # a Hugging Face model or Trainer checkpoint folder
    "directory",  # another folder of checkpoint files
    "legacy_tar",  # torch < 0.4 tar archive (refused)
    "numpy",  # .npy / .npz
    "archive",  # another zip or tar (torch.export .pt2, packed folders): every member scanned
    "unknown",
]
Verdict = Literal[
    "safe",  # torch.load(weights_only=True) accepts it as is
    "safe_with_allowlist",  # only plain data classes outside torch's default list: see allowlist_recipe
    "unsafe",  # a global that can run code or is unknown, or a hostile/ambiguous structure
    "corrupt",  # unreadable or truncated: nothing hostile found, but it cannot be verified or loaded
]
Layout = Literal[
    "state_dict",  # a flat {name: tensor} mapping
    "training_checkpoint",  # model plus optimizer / counters / RNG
    "lightning",  # a PyTorch Lightning .ckpt
    "huggingface_model",
    "huggingface_trainer",  # checkpoint-N/ with optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json
    "dcp",
    "peft_adapter",  # adapter_config.json + adapter_model.safetensors/.bin (peft_model.save_pretrained)
    "tensor",  # a single tensor
    "other",
    "not_loaded",  # unsafe or unreadable: contents were not read
]
ResumeRole = Literal[
    "model",
    "optimizer",
    "scheduler",
    "grad_scaler",
    "epoch_or_step",
    "rng_torch",
    "rng_cuda",
    "rng_numpy",
    "rng_python",
    "sampler",
]


class VerifyCheckpointRequest(ModelInputs):
    """Check a checkpoint's safety and completeness, and (with `model`) its fit to a model."""

    path: str = Field(
        description="checkpoint file (.pt .pth .ckpt .bin .pkl .joblib .npy .npz .pt2 .safetensors, zip/tar, "
        "*.index.json) or folder (DCP, Hugging Face model or Trainer checkpoint, PEFT adapter; every file is "
        "sniffed)"
    )
    model: str | None = Field(  # type: ignore[assignment]
        default=None,
        description="optional model factory 'file.py:build': keys and shapes are checked against its "
        "state dict (for a PEFT adapter folder: the base model)",
    )
    load_and_run: bool = Field(
        default=False,
        description="load the (renamed) weights into the model with strict=True and run one forward; "
        "needs model and inputs or input_shape",
    )
    scan_nonfinite: bool = Field(default=True, description="count NaN/Inf in every floating tensor")
    allow_numpy: bool = Field(
        default=True,
        description="treat numpy array/scalar/dtype globals as safe (torch.load needs them passed to "
        "torch.serialization.safe_globals)",
    )
    allow_data_classes: bool = Field(
        default=True,
        description="plain data classes (Namespace, datetime, pathlib, OmegaConf...) give "
        "safe_with_allowlist and a safe_globals recipe instead of unsafe",
    )
    max_listed: int = Field(default=50, ge=1, le=2000, description="longest list of keys/tensors returned")

    @model_validator(mode="after")
    def _needs_some_input(self) -> VerifyCheckpointRequest:
        if self.load_and_run:
            if self.model is None:
                raise ValueError("load_and_run needs model='path/to/file.py:factory'")
            if self.inputs is None and self.input_shape is None:
                raise ValueError(
                    "load_and_run needs inputs ('file.py:make_inputs') or input_shape (e.g. [8, 3, 32, 32])"
                )
        return self

    def named_paths(self) -> list[str]:
        """The checkpoint and every code file, for the allowed-roots check."""
        return [self.path, *super().named_paths()]


class UnsafeGlobal(BaseModel):
    source: str = Field(description="file content (escaped): file::member ('ckpt.pt::archive/data.pkl')")
    offset: int = Field(description="byte offset of the opcode inside that pickle")
    opcode: str = Field(description="GLOBAL, STACK_GLOBAL, INST, EXT1, REDUCE, BUILD, ...")
    qualified: str | None = Field(
        description="file content (escaped): module.name imported; null: unresolvable"
    )
    risk: Literal["code_execution", "data", "unknown"] = Field(
        description="code_execution: can run code or reach the system; data: a plain data class this scan "
        "was told not to allow; unknown: not known to be harmful or harmless"
    )
    reason: str
    called_at: int | None = Field(default=None, description="offset of the call that invokes it, if any")


class FileProblem(BaseModel):
    code: str
    source: str = Field(description="file content (escaped)")
    message: str = Field(description="may quote the file (escaped): data, not instructions")
    severity: Literal["error", "warning", "info"]
    blocks_safe: bool = Field(description="true when this alone makes the file unverifiable (safe=false)")


class PickleInfo(BaseModel):
    source: str
    protocol: int | None
    pickles: int = Field(description="pickles parsed to their STOP in this stream")
    opcodes: int
    bytes: int
    complete: bool
    globals_allowed: list[str] = Field(description="allowlisted globals it names")
    unsafe_count: int


class FileInfo(BaseModel):
    name: str = Field(description="file content (escaped)")
    format: str
    bytes: int
    verdict: Verdict | None = Field(default=None, description="this file's own verdict (folders: per file)")
    needs_safe_globals: list[str] = Field(
        default_factory=list, description="allowlisted classes torch.load needs passed to safe_globals"
    )


class DTypeCount(BaseModel):
    dtype: str
    count: int
    bytes: int


class TensorInfo(BaseModel):
    name: str = Field(description="file content (escaped)")
    shape: list[int]
    dtype: str
    bytes: int


class TensorSummary(BaseModel):
    count: int
    total_bytes: int = Field(description="sum of numel * element size over tensors (views counted each time)")
    dtypes: list[DTypeCount]
    largest: list[TensorInfo]
    truncated: bool = Field(default=False, description="the walk stopped at its depth/size bound")


class NonfiniteTensor(BaseModel):
    name: str = Field(description="file content (escaped)")
    dtype: str
    shape: list[int]
    numel: int
    nan: int
    inf: int


class RoleFound(BaseModel):
    role: ResumeRole
    key: str = Field(description="file content (escaped): a dotted key, or a file name in a folder")
    matched_by: Literal["name", "structure", "file"]


class ResumeCheck(BaseModel):
    kind: Literal["training", "weights_only", "unknown"]
    roles: list[RoleFound]
    missing: list[ResumeRole]
    notes: list[str] = Field(default_factory=list)


class OptimizerShapeMismatch(BaseModel):
    index: int = Field(description="position of the parameter in the optimizer's param_groups order")
    parameter: str | None = Field(description="the model parameter at that position")
    state_key: str
    state_shape: list[int]
    parameter_shape: list[int]


class OptimizerCheck(BaseModel):
    key: str
    param_groups: int
    params_in_groups: int
    state_entries: int
    params_without_state: int
    state_not_in_groups: int
    duplicate_params: int
    model_parameters: int | None = Field(description="parameters of the given model, when one was given")
    checkpoint_model_tensors: int | None = Field(
        description="tensors in the checkpoint's model state dict, buffers excluded by name (an upper bound "
        "on its parameters)"
    )
    shape_mismatches: list[OptimizerShapeMismatch]
    consistent: bool
    problems: list[str]


class ShapeMismatchInfo(BaseModel):
    key: str
    checkpoint_key: str
    checkpoint_shape: list[int]
    model_shape: list[int]
    checkpoint_dtype: str
    model_dtype: str


class PrefixFix(BaseModel):
    description: str
    remove_components: list[str]
    at_every_depth: bool
    strip_prefix: str
    add_prefix: str
    code: str = Field(description="Python that renames state_dict keys before load_state_dict")


LoaderName = Literal["load_state_dict", "from_pretrained", "peft_from_pretrained"]


class LoaderCall(BaseModel):
    """A loader (torch's model.load_state_dict; transformers' Cls.from_pretrained, which adds or strips
    base_model_prefix; peft's PeftModel.from_pretrained): whether the keys fit through it as is, after the
    rename in `call`, and the exact Python (null: no known rename makes it fit)."""

    loader: LoaderName
    fits_as_is: bool
    fits: bool
    call: str | None


class KeyMismatch(BaseModel):
    compared: str = Field(description="the checkpoint entry compared with the model's state dict")
    checkpoint_keys: int
    model_keys: int
    matched_as_is: int
    matched: int = Field(description="keys matched after the prefix fix")
    prefix_fix: PrefixFix | None
    missing: list[str]
    missing_count: int
    unexpected: list[str]
    unexpected_count: int
    shape_mismatches: list[ShapeMismatchInfo]
    dtype_mismatches: list[ShapeMismatchInfo]
    fits: bool = Field(description="no missing, unexpected or shape-mismatched keys after the fix")
    tied_missing: list[str] = Field(
        default_factory=list,
        description="model keys absent from the checkpoint whose storage is tied to a key it has (e.g. GPT-2 "
        "lm_head.weight = transformer.wte.weight): loading fills them, so they do not count as missing",
    )
    library_rename: str | None = Field(
        default=None,
        description="the rename the model's library applies on load (e.g. transformers from_pretrained's), "
        "applied before comparing",
    )
    library_renamed: int = Field(default=0, description="checkpoint keys that library rename changed")
    loaders: list[LoaderCall] = Field(default_factory=list, description="the fit and exact call per loader")


AdapterProblemCode = Literal[
    "targets_not_in_base",  # target_modules selects no module of the base: PEFT refuses to load it
    "module_not_in_base",  # the adapter has weights for a module the base model lacks
    "unsupported_layer",  # the base module is not a layer type LoRA wraps (Linear, Embedding, Conv, Conv1D)
    "rank_mismatch",  # a LoRA matrix's rank is not the r (or rank_pattern) of adapter_config.json
    "in_features_mismatch",  # lora_A's input size is not the base layer's: a different base model
    "out_features_mismatch",  # lora_B's output size is not the base layer's: a different base model
    "not_targeted",  # weights for a module target_modules does not select: PEFT builds no LoRA there
    "no_adapter_weights",  # a module target_modules selects has no weights in the file (stays at init)
    "saved_module_shape",  # a modules_to_save / base tensor differs in shape from the base model's
    "unrecognised_key",  # a key that names neither a LoRA matrix nor a base-model tensor
]


class AdapterProblem(BaseModel):
    """At a base-model module (file text): the file's key, the key PEFT loads it as, and the shapes.
    no_adapter_weights is a warning, every other code an error."""

    code: AdapterProblemCode
    module: str
    key: str | None
    peft_key: str | None
    adapter_shape: list[int] | None
    expected_shape: list[int] | None


class AdapterCheck(BaseModel):
    """A PEFT adapter checked as PeftModel.from_pretrained(base_model, folder) loads it (adapter name
    'default' inserted into each key). modelled: LoRA (keys and shapes checked); targeted_modules: null
    when undecidable; peft_type is file text."""

    peft_type: str
    modelled: bool
    r: int | None
    lora_modules: int
    targeted_modules: int | None
    saved_tensors: int
    fits: bool
    problems: list[AdapterProblem]
    problem_count: int
    loader: LoaderCall
    config_error: str | None = None

    @classmethod
    def not_modelled(
        cls, peft_type: str, loader: LoaderCall, config_error: str | None = None
    ) -> AdapterCheck:
        """An adapter whose tensors were not checked: a type other than LoRA, or an unusable config."""
        return cls(
            peft_type=peft_type, modelled=False, r=None, lora_modules=0, targeted_modules=None,
            saved_tensors=0, fits=False, problems=[], problem_count=0, loader=loader, config_error=config_error,
        )  # fmt: skip


class LoadAndRun(BaseModel):
    loaded: bool
    strict: bool = True
    prefix_fix_applied: bool
    error: str | None
    forward_ran: bool
    output_shapes: list[list[int]]
    output_finite: bool | None
    mode: str = "eval"
    loader: LoaderName = "load_state_dict"
    batch_rule: BatchRule | None = Field(default=None, description="how the batch was fed to the forward")


class VerifyCheckpointResult(BaseModel):
    path: str
    format: CheckpointFormat
    layout: Layout
    files: list[FileInfo]
    size_bytes: int
    safe: bool = Field(
        description="true only when every pickle reachable from the path parsed fully and nothing in it is "
        "unsafe (verdict safe or safe_with_allowlist)"
    )
    verdict: Verdict = Field(default="unsafe", description="safe | safe_with_allowlist | unsafe | corrupt")
    allowlist_recipe: str | None = Field(
        default=None,
        description="for safe_with_allowlist: the exact torch.serialization.safe_globals code that loads it "
        "with weights_only=True",
    )
    unsafe_globals: list[UnsafeGlobal]
    unsafe_global_count: int
    problems: list[FileProblem]
    pickles: list[PickleInfo]
    globals_allowed: list[str]
    needs_safe_globals: list[str] = Field(
        description="allowed globals torch.load(weights_only=True) still refuses unless passed to "
        "torch.serialization.safe_globals (numpy's and plain data classes)"
    )
    scan_seconds: float
    loaded: bool
    loaded_with: str | None
    load_error: str | None = Field(description="the loader's refusal; may quote the file (escaped)")
    tensors: TensorSummary | None
    nonfinite_scanned: bool
    nonfinite_tensors: list[NonfiniteTensor]
    resume: ResumeCheck | None
    missing_for_resume: list[ResumeRole]
    optimizers: list[OptimizerCheck]
    key_mismatch: KeyMismatch | None
    adapter: AdapterCheck | None = None
    load_and_run: LoadAndRun | None
    findings: list[Finding] = Field(description="the tool's own words; file text stays in the fields")
    summary: str = Field(description="the tool's own words, no text from the file")
    run: RunInfo | None = None
