"""The user-code contract shared by every torch tool, as pydantic models (no torch here).

Use `CodeRef.parse("models/net.py:build")` to split a reference, and embed `ModelInputs` in a
tool's request. The worker side that actually imports and calls the code is
`torch_skills.runner.usercode`.

A reference is either `path/to/file.py:name` (a file, relative to the server's working directory)
or `package.module:name` (an importable module). `name` may be dotted (`Net.from_config`). Which
references may run is `torch_skills.refpolicy`'s rule.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

DType = Literal["float32", "float64", "float16", "bfloat16", "int64", "int32", "bool"]
Device = Literal["auto", "cpu", "cuda"]
Mode = Literal["train", "inference"]
Precision = Literal["fp32", "bf16", "fp16", "bf16_autocast", "fp16_autocast"]  # *_autocast: fp32 weights

_MODULE_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_ATTR_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


# Longest path or reference accepted (Linux PATH_MAX): anything longer is a mistake or an attack.
MAX_NAME_CHARS = 4096


class CodeRefError(ValueError):
    """A reference string that is not `file.py:name` or `package.module:name`."""


class BadName(CodeRefError):
    """A path or reference no file system or interpreter can take: NUL, overlong, not UTF-8."""


def check_name(text: str, what: str = "the path") -> str:
    """Return `text` if it can name a file or module; raise BadName saying what is wrong otherwise.

    Refused: a NUL character, more than MAX_NAME_CHARS characters, and unpaired surrogates (what
    bytes that are not UTF-8 become, e.g. a JSON "\\udc80" escape)."""
    if len(text) > MAX_NAME_CHARS:
        raise BadName(
            f"{what} is {len(text)} characters long; paths and references are limited to {MAX_NAME_CHARS}. "
            "Pass the real path of the file."
        )
    if "\x00" in text:
        raise BadName(
            f"{what} {text[:200]!r} contains a NUL character (at position {text.index(chr(0))}), which no file "
            "name can hold; pass the path without it."
        )
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            raise BadName(
                f"{what} {text[:200]!r} is not valid UTF-8 text (an unpaired surrogate {ch!r} at position {i}); "
                "rename the file or folder to a UTF-8 name, or pass a path that is."
            )
    return text


class CodeRef(BaseModel):
    """A parsed reference to a callable in the user's code."""

    raw: str
    path: str | None = Field(default=None, description="file path as given, when the reference names a file")
    module: str | None = Field(default=None, description="dotted module, when the reference names a module")
    attr: str

    @classmethod
    def parse(cls, text: str) -> CodeRef:
        """Split `"file.py:build"` or `"pkg.mod:build"`; raise CodeRefError with an example otherwise."""
        check_name(text, "the reference")
        text = text.strip()
        if ":" not in text:
            raise CodeRefError(
                f"{text!r} names no callable: write 'path/to/file.py:factory' or 'package.module:factory'"
            )
        target, attr = text.rsplit(":", 1)
        if not target or not _ATTR_RE.match(attr):
            raise CodeRefError(f"{text!r}: after ':' comes the callable's name, e.g. 'models.py:build_model'")
        if target.endswith(".py") or "/" in target or "\\" in target:
            return cls(raw=text, path=target, attr=attr)
        if _MODULE_RE.match(target):
            return cls(raw=text, module=target, attr=attr)
        raise CodeRefError(f"{text!r}: {target!r} is neither a .py file path nor a dotted module name")

    @property
    def display(self) -> str:
        return self.path if self.path is not None else str(self.module)


# Fields that name code: the shared ones, plus `data` (profile_model, check_distributed) and
# `function` (check_gradients) on the requests that have them.
REFERENCE_FIELDS = ("model", "inputs", "loss", "data", "function")


class ModelInputs(BaseModel):
    """Which model to build and what to feed it: the fields every torch tool shares."""

    model: str = Field(
        description="'file.py:build' (your factory), an nn.Module class ('torch.nn:Linear') "
        "or a listed factory ('timm:create_model')"
    )
    model_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="the factory's keyword arguments",
    )
    inputs: str | None = Field(
        default=None,
        description="'file.py:make_inputs' returning one batch (tensor, tuple or dict), "
        "may take batch_size; or give input_shape",
    )
    input_shape: list[int] | None = Field(
        default=None,
        description="shape of a random batch, e.g. [8, 3, 32, 32], if no inputs",
    )
    input_dtype: DType = Field(default="float32", description="dtype of the random batch")
    loss: str | None = Field(
        default=None,
        description="'file.py:loss_fn': loss_fn(output, batch) -> scalar; "
        "default: the output's mean (summed over tensors)",
    )
    device: Device = Field(default="auto", description="'auto': CUDA when present, else CPU")
    cpu_threads: int | None = Field(  # runner.threads has the rule and the measurements behind it
        default=None,
        ge=1,
        le=1024,
        description="torch threads (default: round(cores - load avg), >= 1)",
    )

    @field_validator(*REFERENCE_FIELDS, check_fields=False)  # a request type may lack data/function
    @classmethod
    def _is_a_reference(cls, value: str | None) -> str | None:
        if value is not None:
            CodeRef.parse(value)
        return value

    @field_validator("input_shape")
    @classmethod
    def _shape_is_sane(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if not value or len(value) > 8 or any(d <= 0 for d in value):
                raise ValueError("input_shape needs 1 to 8 positive sizes, e.g. [8, 3, 32, 32]")
            numel = 1
            for d in value:
                numel *= d
            if numel > 2**34:
                raise ValueError(f"input_shape {value} has {numel} elements; that is beyond any real batch")
        return value

    @model_validator(mode="after")
    def _needs_some_input(self) -> ModelInputs:
        if self.inputs is None and self.input_shape is None:
            raise ValueError("give inputs ('file.py:make_inputs') or input_shape (e.g. [8, 3, 32, 32])")
        return self

    def code_refs(self) -> list[CodeRef]:
        """Every reference in this request (REFERENCE_FIELDS it has and sets), for the allowed-roots check."""
        raw = (getattr(self, name, None) for name in REFERENCE_FIELDS)
        return [CodeRef.parse(r) for r in raw if r is not None]

    def named_paths(self) -> list[str]:
        """Every file path the request names, for the allowed-roots check (module references are
        checked in the worker). Requests with path fields of their own extend it."""
        return [ref.path for ref in self.code_refs() if ref.path is not None]
