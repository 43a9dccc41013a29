"""Which globals a checkpoint's pickle may name and still count as safe.

Use `Policy(numpy=True).classify("torch._utils._rebuild_tensor_v2")` -> `"torch"` (the tier that
allows it) or `None` (unsafe), and `risk_of("posix.system")` -> `"code_execution"` to label an
unsafe global. Names are `module.qualname` after the Python 2 renames (`__builtin__.set` ->
`builtins.set`), exactly as `torch.load` spells them.

Tiers:
- `TORCH_WEIGHTS_ONLY`: what `torch.load(weights_only=True)` accepts by default in torch 2.13,
  i.e. the keys of `torch._weights_only_unpickler._get_allowed_globals()` (read from
  torch/_weights_only_unpickler.py of the installed 2.13.0: OrderedDict, Counter, Parameter,
  `_get_layout`, Size, Tensor, device, `_codecs.encode`, bytearray, set, complex, every dtype,
  the legacy tensor and storage classes, the quantization schemes, the `_rebuild_*` functions and
  `_rebuild_from_type_v2`). Nothing more: tests/test_checkpoint_pickle_scan.py checks it is a
  subset of the installed torch's list, and equal to it on torch 2.13.
- `NUMPY_DATA`: the numpy globals an array, a scalar or a dtype pickles to (`_reconstruct`,
  `_frombuffer` for protocol 5, `ndarray`, `dtype`, `scalar`, the `numpy.dtypes` classes).
  torch 2.13 refuses them unless the caller passes them to `torch.serialization.safe_globals`,
  which is what the tool does after the scan; they only build arrays from bytes. Off with
  `Policy(numpy=False)`.
- `HARMLESS_DATA`: classes that only hold data and that torch.load(weights_only=True) still
  refuses by default: argparse.Namespace (timm's `args`, Lightning hparams), datetime, pathlib
  paths, collections.defaultdict/deque, the plain builtin types when named as globals (a
  `defaultdict(list)` names `builtins.list`), OmegaConf's containers and nodes (Lightning/Hydra
  hparams), Lightning's AttributeDict, `torch.torch_version.TorchVersion`, and Hugging Face's
  `TrainingArguments` with the enums and state records it pickles (read from what transformers
  5.x and accelerate write into `training_args.bin`). Unpickling them builds a record: no file,
  process or import side effect. The file is then "safe to load with an allowlist": the worker
  loads it with weights_only=True inside `torch.serialization.safe_globals([...])` naming
  exactly the classes it uses, and the result carries that recipe. Off with
  `Policy(data_classes=False)`.
- `DCP_METADATA`: the dataclasses torch.distributed.checkpoint writes into its `.metadata` pickle
  (plus `pathlib.PosixPath` for `StorageMeta.checkpoint_id`); allowed only when scanning a DCP
  `.metadata` file, which the tool reads with stand-in classes, never the real ones.

Known limitations: a global that is harmless but not listed (a user's own config class or enum)
is unsafe here, as it is for weights_only loading; the finding names it and says its risk is
unknown rather than code execution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Tier = Literal["torch", "numpy", "data", "dcp", "joblib", "torchscript"]
Risk = Literal["code_execution", "data", "unknown"]


def words(text: str) -> list[str]:
    """Names from a block of space-separated words (keeps long name lists compact)."""
    return text.split()


_DTYPES = words(
    "bfloat16 bits16 bits1x8 bits2x4 bits4x2 bits8 bool complex128 complex32 complex64 float16 float32 "
    "float4_e2m1fn_x2 float64 float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu "
    "int1 int16 int2 int3 int32 int4 int5 int6 int64 int7 int8 qint32 qint8 quint2x4 quint4x2 quint8 "
    "uint1 uint16 uint2 uint3 uint32 uint4 uint5 uint6 uint64 uint7 uint8"
)
TORCH_DTYPE_NAMES: frozenset[str] = frozenset(_DTYPES)
_LEGACY_TENSORS = words("BFloat16 Bool Byte Char Double Float Half Int Long Short")
_SPARSE_TENSORS = words("BFloat16 Byte Char Double Float Half Int Long Short")
_STORAGES = words("BFloat16 Bool Byte Char ComplexDouble ComplexFloat Double Float Half Int Long Short")
_QUANTIZED_STORAGES = words("QInt32 QInt8 QUInt2x4 QUInt4x2 QUInt8")
_REBUILD = words(
    "_rebuild_device_tensor_from_cpu_tensor _rebuild_device_tensor_from_numpy "
    "_rebuild_meta_tensor_no_storage _rebuild_nested_tensor _rebuild_parameter "
    "_rebuild_parameter_with_state _rebuild_qtensor _rebuild_sparse_tensor _rebuild_tensor "
    "_rebuild_tensor_v2 _rebuild_tensor_v3 _rebuild_wrapper_subclass"
)
_QSCHEMES = words(
    "per_channel_affine per_channel_affine_float_qparams per_channel_symmetric per_tensor_affine "
    "per_tensor_symmetric"
)

# torch 2.13.0, torch/_weights_only_unpickler.py, _get_allowed_globals(): 144 names.
TORCH_WEIGHTS_ONLY: frozenset[str] = frozenset(
    [
        "collections.OrderedDict",
        "collections.Counter",
        "torch.nn.parameter.Parameter",
        "torch.serialization._get_layout",
        "torch.Size",
        "torch.Tensor",
        "torch.device",
        "_codecs.encode",
        "builtins.bytearray",
        "builtins.set",
        "builtins.complex",
        "torch._tensor._rebuild_from_type_v2",
        "torch.storage.TypedStorage",
        "torch.storage.UntypedStorage",
    ]
    + [f"torch.{d}" for d in _DTYPES]
    + [f"torch.{q}" for q in _QSCHEMES]
    + [f"torch._utils.{f}" for f in _REBUILD]
    + [f"torch.{t}Tensor" for t in _LEGACY_TENSORS]
    + [f"torch.cuda.{t}Tensor" for t in _LEGACY_TENSORS]
    + [f"torch.sparse.{t}Tensor" for t in _SPARSE_TENSORS]
    + [f"torch.cuda.sparse.{t}Tensor" for t in _SPARSE_TENSORS]
    + [f"torch.{s}Storage" for s in _STORAGES + _QUANTIZED_STORAGES]
    + [f"torch.cuda.{s}Storage" for s in _STORAGES]
)

_NUMPY_DTYPE_CLASSES = words(
    "Bool Int8 UInt8 Int16 UInt16 Int32 UInt32 Int64 UInt64 Float16 Float32 Float64 LongDouble "
    "Complex64 Complex128 CLongDouble Object Str Bytes"
)

# The globals numpy (1.x and 2.x) pickles arrays, scalars and dtypes to.
NUMPY_DATA: frozenset[str] = frozenset(
    [
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray.scalar",
        "numpy.core.numeric._frombuffer",  # protocol 5 pickles of contiguous arrays
        "numpy._core.numeric._frombuffer",
        "numpy.ndarray",
        "numpy.dtype",
    ]
    + [f"numpy.dtypes.{c}DType" for c in _NUMPY_DTYPE_CLASSES]
)

_PATHS = words("Path PosixPath WindowsPath PurePath PurePosixPath PureWindowsPath")
_OMEGACONF = words(
    "dictconfig.DictConfig listconfig.ListConfig base.ContainerMetadata base.Metadata nodes.AnyNode "
    "nodes.StringNode nodes.IntegerNode nodes.FloatNode nodes.BooleanNode nodes.BytesNode nodes.PathNode "
    "nodes.EnumNode nodes.ValueNode"
)
# Plain data records; see the module docstring. Each builds an object from its arguments/state only.
HARMLESS_DATA: frozenset[str] = frozenset(
    [
        "argparse.Namespace",
        "collections.defaultdict",
        "collections.deque",
        "collections.OrderedDict",
        "collections.Counter",
        "datetime.datetime",
        "datetime.date",
        "datetime.time",
        "datetime.timedelta",
        "datetime.timezone",
        "decimal.Decimal",
        "fractions.Fraction",
        "uuid.UUID",
        "typing.Any",  # OmegaConf records ref_type=Any
        "torch.torch_version.TorchVersion",
        "lightning.fabric.utilities.data.AttributeDict",
        "lightning_fabric.utilities.data.AttributeDict",
        "pytorch_lightning.utilities.parsing.AttributeDict",
        "transformers.training_args.TrainingArguments",
        "transformers.training_args.OptimizerNames",
        "transformers.trainer_pt_utils.AcceleratorConfig",
        "transformers.trainer_utils.HubStrategy",
        "transformers.trainer_utils.IntervalStrategy",
        "transformers.trainer_utils.SaveStrategy",
        "transformers.trainer_utils.SchedulerType",
        "transformers.trainer_utils.FSDPOption",
        "transformers.debug_utils.DebugOption",
        "accelerate.utils.dataclasses.DistributedType",
        "accelerate.state.PartialState",  # a record of the run's device setup; __init__ is not called
    ]
    + [
        f"builtins.{t}"
        for t in words("dict list tuple set frozenset int float complex str bytes bool slice range")
    ]
    + [f"pathlib.{c}" for c in _PATHS]
    + [f"pathlib._local.{c}" for c in _PATHS]  # Python >= 3.13
    + [f"omegaconf.{c}" for c in _OMEGACONF]
)

# builtins that hand a pickle code execution, attribute access or files
_DANGEROUS_BUILTINS = frozenset(
    words(
        "eval exec compile __import__ open getattr setattr delattr globals locals vars breakpoint input help "
        "exit quit __build_class__ __loader__ map filter iter next apply execfile reload file"
    )
)

# joblib.dump writes each numpy array as this wrapper (its state: subclass, shape, order, dtype),
# followed by the array's raw bytes outside the pickle; joblib.load's BUILD then reads those bytes
# (joblib/numpy_pickle.py, NumpyArrayWrapper.read_array). The scan skips exactly those bytes, so
# the wrapper is data; an object dtype is a nested pickle there, and is scanned as one.
JOBLIB_ARRAYS: frozenset[str] = frozenset({"joblib.numpy_pickle.NumpyArrayWrapper"})

_DCP = "torch.distributed.checkpoint"
# What FileSystemWriter pickles into `.metadata` (torch 2.13, distributed/checkpoint/metadata.py).
DCP_METADATA: frozenset[str] = frozenset(
    [
        f"{_DCP}.metadata.Metadata",
        f"{_DCP}.metadata.MetadataIndex",
        f"{_DCP}.metadata.TensorStorageMetadata",
        f"{_DCP}.metadata.BytesStorageMetadata",
        f"{_DCP}.metadata.ChunkStorageMetadata",
        f"{_DCP}.metadata.TensorProperties",
        f"{_DCP}.metadata.StorageMeta",
        f"{_DCP}.metadata._MEM_FORMAT_ENCODING",
        f"{_DCP}.filesystem._StorageInfo",
        "pathlib.PosixPath",
        "pathlib._local.PosixPath",  # Python >= 3.13 moved it
    ]
)

# Modules whose globals hand the file a way to run code, touch files or the network, or import
# more of them. Only used to label an unsafe global; every unlisted global is unsafe too.
_CODE_EXECUTION_MODULES = frozenset(
    words(
        "os posix nt sys subprocess pty runpy importlib pkgutil pip ensurepip venv shutil webbrowser "
        "socket ctypes pickle _pickle cPickle dill joblib marshal types code codeop timeit cProfile profile "
        "pdb bdb trace asyncio multiprocessing threading _thread signal operator _operator functools "
        "copyreg inspect zipimport http urllib requests ftplib smtplib telnetlib tempfile io _io glob "
        "platform sysconfig site builtins __builtin__ imp _imp _posixsubprocess posixpath"
    )
)
_CODE_EXECUTION_NAMES = frozenset(
    [
        "torch.load",
        "torch.serialization.load",
        "torch.storage._load_from_bytes",
        "torch.hub.load",
        "torch.jit.load",
        "torch._C._jit_script_compile",
        "torch.utils.cpp_extension.load_inline",
        "numpy.load",
        "numpy.testing._private.utils.runstring",
        "numpy.lib.npyio.load",
    ]
)


def risk_of(qualified: str | None) -> Risk:
    """'code_execution' for a global known to run code or reach the system, 'data' for a plain
    data record, else 'unknown' (not known to be harmful, not known to be harmless)."""
    if qualified is None:
        return "code_execution"  # unresolvable: it could be anything
    if qualified in HARMLESS_DATA:
        return "data"
    if qualified in _CODE_EXECUTION_NAMES:
        return "code_execution"
    root, _, rest = qualified.partition(".")
    if root in ("builtins", "__builtin__"):
        # a dotted name walks attributes: builtins.str.format is a method, not the str type
        return "unknown" if "." not in rest and rest not in _DANGEROUS_BUILTINS else "code_execution"
    if root in _CODE_EXECUTION_MODULES:
        return "code_execution"
    if qualified.startswith(("torch.hub", "torch.jit", "torch._C", "torch.utils.cpp_extension")):
        return "code_execution"
    return "unknown"


@dataclass(frozen=True)
class Policy:
    """Which tiers count as safe for one scan."""

    numpy: bool = True  # array/scalar/dtype globals from numpy
    data_classes: bool = True  # HARMLESS_DATA: safe with a safe_globals allowlist
    dcp: bool = False  # only for a DCP `.metadata` pickle
    joblib: bool = True  # joblib's array wrapper, whose raw bytes the scan skips (JOBLIB_ARRAYS)
    # only inside a TorchScript archive: torch.jit.load's own unpickler resolves `__torch__.*` to the
    # archive's compiled classes and `torch.jit._pickle.*` to its list builders, never a Python import;
    # the archive is refused as code anyway (torchscript_archive)
    torchscript: bool = False

    def classify(self, qualified: str) -> Tier | None:
        """The tier that allows `qualified`, or None when it is unsafe."""
        if qualified in TORCH_WEIGHTS_ONLY:
            return "torch"
        if self.numpy and qualified in NUMPY_DATA:
            return "numpy"
        if self.dcp and qualified in DCP_METADATA:  # read with stand-ins, never torch.load: no recipe needed
            return "dcp"
        if self.data_classes and qualified in HARMLESS_DATA:
            return "data"
        if self.joblib and self.numpy and qualified in JOBLIB_ARRAYS:
            return "joblib"
        if self.torchscript and qualified.startswith(("__torch__.", "torch.jit._pickle.")):
            return "torchscript"
        return None
