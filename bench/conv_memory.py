"""estimate_memory on conv-heavy third-party models (CPU target) against the CPU allocator's peak.

Run (needs transformers and diffusers, the `.[zoo]` extra):

    python bench/conv_memory.py                    # every model, train and inference, batch 2 and 4
    python bench/conv_memory.py --models vae,unet --precision bf16_autocast

Models, built from configs, never downloaded:
- Wav2Vec2ForCTC with the base model's 7-layer 1-D conv feature encoder (512 channels) and
  LayerDrop 0.1 (Hugging Face's default), 2 encoder layers of width 256, one second of 16 kHz audio;
- diffusers AutoencoderKL, 3 blocks (64, 128, 128 channels), 2 layers each, 128x128 images;
- diffusers UNet2DConditionModel, 2 blocks (64, 128), cross-attention, 32x32 latents.

Each case goes through the tool's worker function (`torch_skills.memory.worker.run`, target cpu,
Adam) and is compared with `torch_skills.memory.groundtruth.measure_real_step` (three real steps,
the peak of live CPU-allocator bytes from the profiler's events). It prints the method the tool
used (traced, measured, extrapolated), the error and the kernel scratch the estimate holds at its
peak. LayerDrop draws which layers run, so a real-run estimate of Wav2Vec2 in training can differ
from the three measured steps by the layers each skipped.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO))
import torch  # noqa: E402

from torch_skills.memory.groundtruth import measure_real_step  # noqa: E402
from torch_skills.memory.models import EstimateMemoryRequest  # noqa: E402
from torch_skills.memory.trace import StepSpec  # noqa: E402
from torch_skills.memory.worker import run  # noqa: E402
from torch_skills.runner.child import JobContext  # noqa: E402
from torch_skills.runner.usercode import default_loss  # noqa: E402

HERE = "bench/conv_memory.py"


def wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    config = Wav2Vec2Config(
        vocab_size=32,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=512,
        mask_time_prob=0.0,
        layerdrop=0.1,
    )
    return Wav2Vec2ForCTC(config)


def wav2vec2_inputs(batch_size: int = 2):
    return {"input_values": torch.randn(batch_size, 16000)}  # (B, samples): one second at 16 kHz


def vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=(64, 128, 128),
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        layers_per_block=2,
        latent_channels=4,
        norm_num_groups=32,
        sample_size=128,
    )


def vae_inputs(batch_size: int = 2):
    return {"sample": torch.randn(batch_size, 3, 128, 128)}  # (B, C, H, W)


def unet():
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=32,
        in_channels=4,
        out_channels=4,
        layers_per_block=2,
        block_out_channels=(64, 128),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        norm_num_groups=32,
        attention_head_dim=8,
    )


def unet_inputs(batch_size: int = 2):
    return {
        "sample": torch.randn(batch_size, 4, 32, 32),  # (B, C, H, W) latents
        "timestep": torch.tensor(10),
        "encoder_hidden_states": torch.randn(batch_size, 16, 32),  # (B, tokens, cross_attention_dim)
    }


MODELS = {"wav2vec2": (wav2vec2, wav2vec2_inputs), "vae": (vae, vae_inputs), "unet": (unet, unet_inputs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    job = JobContext(Path(tempfile.mkdtemp()), "cpu", [str(REPO)], str(REPO))
    print(
        f"{'model':9s} {'mode':9s} {'batch':>5s} {'method':12s} {'truth MiB':>10s} {'estimate':>10s} {'error':>7s} {'scratch':>8s}"
    )
    errors = []
    for name in args.models.split(","):
        build, inputs = MODELS[name]
        for mode in ("train", "inference"):
            for batch in (2, 4):
                request = EstimateMemoryRequest(
                    model=f"{HERE}:{name}",
                    inputs=f"{HERE}:{name}_inputs",
                    batch_size=batch,
                    mode=mode,
                    optimizer="adam",
                    precision=args.precision,
                    target_device="cpu",
                )
                result = run(request, job)
                spec = StepSpec(mode=mode, optimizer="adam", precision=args.precision)
                truth = measure_real_step(
                    build, inputs, lambda out, b: default_loss(out), spec, batch_size=batch
                ).peak_allocated_bytes
                error = (result.peak_allocated_bytes - truth) / truth
                errors.append(abs(error))
                print(
                    f"{name:9s} {mode:9s} {batch:5d} {result.method:12s} {truth / 2**20:10.2f} "
                    f"{result.peak_allocated_bytes / 2**20:10.2f} {error:+7.2%} {result.kernel_scratch_bytes / 2**20:8.2f}",
                    flush=True,
                )
    print(
        f"\n|error|: median {statistics.median(errors):.2%}, worst {max(errors):.2%} over {len(errors)} cases"
    )


if __name__ == "__main__":
    main()
