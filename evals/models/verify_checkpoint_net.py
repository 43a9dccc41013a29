"""Model and checkpoint files for the verify_checkpoint eval scenarios.

The scenarios (evals/scenarios/verify_checkpoint.py) point the tool at the small checkpoint files
beside this one and at `build` / `build_wide` / `make_inputs` here. Regenerate the files with

    python evals/models/verify_checkpoint_net.py

(their bytes change on every save: torch writes a random serialization id). The payload file is
a hand-written pickle that would call builtins.exec on a harmless print if someone unpickled it;
it exists so the eval can check that the tool names it without running it.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root, also when run as a script

from tests.fixtures.checkpoint_models import TinyNet  # noqa: E402  (the net the tests use too)


def build() -> TinyNet:
    return TinyNet()


def build_wide() -> TinyNet:
    """Hidden size 32 instead of 16: the checkpoints here do not fit it."""
    return TinyNet(hidden=32)


def make_inputs(batch_size: int = 2) -> torch.Tensor:
    return torch.randn(batch_size, 8, generator=torch.Generator().manual_seed(0))


def write_files() -> None:
    from tests.fixtures.checkpoint_corpus import write_safetensors

    torch.manual_seed(0)
    net = TinyNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(make_inputs(4)).mean().backward()
    opt.step()
    torch.save(torch.nn.DataParallel(net).state_dict(), HERE / "verify_checkpoint_ddp.pt")
    torch.save(
        {
            "model": net.state_dict(),
            "optimizer": opt.state_dict(),
            "epoch": 3,
            "torch_rng_state": torch.get_rng_state(),
        },
        HERE / "verify_checkpoint_resume_gaps.pt",
    )
    weights = {k: v.clone() for k, v in net.state_dict().items() if v.is_floating_point()}
    weights["fc1.weight"][0, 0] = float("nan")
    write_safetensors(HERE / "verify_checkpoint_nan.safetensors", weights)
    # builtins.exec("print('verify_checkpoint eval payload')"), protocol 2, written opcode by opcode
    code = b"print('verify_checkpoint eval payload')"
    payload = b"\x80\x02cbuiltins\nexec\nX" + struct.pack("<I", len(code)) + code + b"\x85R."
    (HERE / "verify_checkpoint_payload.pkl").write_bytes(payload)


if __name__ == "__main__":
    write_files()
