"""CUDA-only memory that a fake-tensor trace cannot see, checked on CPU against figures measured on an H100.

The figures come from bench/gpu/results/peakdiff.json (torch 2.11+cu130, H100 80GB HBM3, 132 SMs): the
allocator's in-op peak above the inputs during each `sum` that computes a Linear bias gradient.
"""

from __future__ import annotations

import pytest
import torch

from torch_skills.memory.cudakernels import CudaKernelModel, GpuSpec, outer_reduction_buffers
from torch_skills.memory.estimate import Target, estimate_trace
from torch_skills.memory.ledger import ALLOC, OP
from torch_skills.memory.trace import StepSpec, trace_step
from torch_skills.runner.usercode import default_loss

H100 = GpuSpec(sm_count=132, threads_per_sm=2048, name="H100")

# (rows reduced, bias width, bytes measured inside the op on the H100)
MEASURED_BIAS_GRAD_SCRATCH = [
    (32 * 197, 384, 19_464_204),  # ViT-S/16, batch 32: attention output projection
    (32 * 197, 1152, 58_392_612),  # ViT-S/16: fused qkv
    (32 * 197, 1536, 77_856_816),  # ViT-S/16: MLP fc1
    (16 * 512, 768, 50_331_672),  # nn.TransformerEncoder 768 wide, batch 16 x 512
    (16 * 512, 3072, 138_412_128),  # its feed-forward linear1
    (16 * 512, 2304, 139_198_536),  # its in_proj (3 x 768)
    (8 * 512, 768, 25_165_848),  # BERT-base width, batch 8 x 512
    (8 * 512, 3072, 100_663_392),  # BERT intermediate
    (8 * 512, 8192, 138_412_288),  # BERT MLM decoder over an 8192 vocabulary
]


@pytest.mark.parametrize(("rows", "width", "measured"), MEASURED_BIAS_GRAD_SCRATCH)
def test_the_reduction_model_gives_the_bias_gradient_scratch_measured_on_an_h100(rows, width, measured):
    """setReduceConfig's global buffer plus semaphores equals, to the byte, what the H100 allocated inside sum(0)."""
    assert sum(outer_reduction_buffers(rows, width, 4, H100)) == measured


def test_a_reduction_that_fills_the_gpu_without_splitting_needs_no_buffer():
    """A sum(0) over 8 rows is done by one block per output column: no global-memory buffer."""
    assert outer_reduction_buffers(8, 4096, 4, H100) == []


def vit_mlp():
    return torch.nn.Linear(384, 1536)


def vit_tokens(batch_size=None):
    return torch.randn(batch_size or 32, 197, 384)  # (B, T, C) as in ViT-S/16


def mean_loss(output, batch):
    return default_loss(output)


def test_a_cuda_target_counts_the_bias_gradient_scratch_of_a_bf16_linear():
    """A bf16 Linear(384, 1536) on 32 x 197 tokens: the trace for CUDA holds the 77,856,816 B sum(0) takes on an H100."""
    spec = StepSpec(precision="bf16", optimizer="sgd", foreach=True)
    plain = trace_step(vit_mlp, vit_tokens, mean_loss, spec)
    modelled = trace_step(vit_mlp, vit_tokens, mean_loss, spec, cuda_kernels=CudaKernelModel(H100))
    scratch, seen = [], False
    for tag, value in modelled.events:
        if tag == OP:
            seen = seen or value.op == "sum (kernel scratch)"
            if seen:
                break
            scratch = []
        elif tag == ALLOC:
            scratch.append(value.nbytes)
    assert seen and scratch[-2:] == [77_856_768, 48]
    assert modelled.kernel_gpu == "H100"
    before = estimate_trace(plain, Target(cuda=True, hopper=True))
    after = estimate_trace(modelled, Target(cuda=True, hopper=True))
    assert before.op != "sum (kernel scratch)"
    assert after.op == "sum (kernel scratch)"  # the step now peaks inside the bias-gradient sum
    assert after.breakdown["temporaries"] >= 77_856_768 + 512  # the semaphores take a 512 B block
    assert after.peak_allocated > before.peak_allocated


def test_without_a_cuda_target_no_kernel_scratch_is_added():
    """trace_step without cuda_kernels (a CPU target) records no modelled scratch for the same sum."""
    spec = StepSpec(precision="bf16", optimizer="sgd")
    trace = trace_step(vit_mlp, vit_tokens, mean_loss, spec)
    assert not any(tag == OP and "kernel scratch" in value.op for tag, value in trace.events)
    assert trace.kernel_gpu is None


def small_mlp(bias=True):
    return torch.nn.Sequential(
        torch.nn.Linear(64, 64, bias=bias), torch.nn.ReLU(), torch.nn.Linear(64, 64, bias=bias)
    )


def rows(batch_size=None):
    return torch.randn(batch_size or 8, 64)  # (B, C)


LT = 1024 * 1024  # CUBLASLT_WORKSPACE_SIZE default
SM90_CUBLAS = 32 * 2**20


@pytest.mark.parametrize(
    ("bias", "spec", "expected"),
    [
        (True, StepSpec(mode="inference", optimizer="none"), SM90_CUBLAS + LT),  # one thread runs addmm
        (False, StepSpec(mode="inference", optimizer="none"), SM90_CUBLAS),  # mm only: no cuBLASLt
        (True, StepSpec(optimizer="sgd", foreach=True), 2 * SM90_CUBLAS + LT),  # backward runs mm, not addmm
        (
            True,
            StepSpec(optimizer="sgd", foreach=True, checkpoint_classes=("Sequential",)),
            2 * SM90_CUBLAS + 2 * LT,
        ),  # the recomputed forward runs addmm on autograd's thread too
    ],
)
def test_a_biased_linear_adds_one_mib_of_cublaslt_workspace_per_thread_that_runs_it(bias, spec, expected):
    """As measured on an H100: +1 MiB per thread running addmm (ViT, BERT), +2 MiB with checkpointing (GPT), none for mm."""
    trace = trace_step(lambda: small_mlp(bias), rows, mean_loss, spec)
    est = estimate_trace(trace, Target(cuda=True, hopper=True, training=spec.mode == "train"))
    assert est.workspace_bytes == expected


def test_the_cuda_context_is_the_figure_measured_on_an_h100():
    """The CUDA context stated for a CUDA target is the 684.8 MiB measured on an H100 (CUDA 13), rounded up to 685 MiB."""
    trace = trace_step(small_mlp, rows, mean_loss, StepSpec(mode="inference", optimizer="none"))
    assert estimate_trace(trace, Target(cuda=True)).context_bytes == 685 * 2**20


# (query shape (B, H, T, D), bytes measured inside _scaled_dot_product_cudnn_attention_backward on the H100)
MEASURED_CUDNN_ATTENTION_SCRATCH = [
    ((32, 6, 197, 64), 9_834_496),  # ViT-S/16, batch 32, bf16
    ((8, 12, 512, 64), 12_779_776),  # BERT-base width, batch 8 x 512, bf16
    ((16, 12, 512, 64), 25_559_296),  # nn.TransformerEncoder, batch 16 x 512, bf16
    ((8, 12, 1024, 64), 25_559_296),  # GPT 768 wide, batch 8 x 1024, bf16 autocast
]


@pytest.mark.parametrize(("shape", "measured"), MEASURED_CUDNN_ATTENTION_SCRATCH)
def test_the_cudnn_attention_backward_workspace_is_the_size_measured_on_an_h100(shape, measured):
    """cuDNN SDPA backward: fp32 dQ accumulator + fp32 row statistics + 256 B, as measured, from shapes alone."""
    q = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    func = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default
    assert sum(CudaKernelModel(H100).scratch(func, (q, q, q, q, q), {})) == measured


def test_the_cuda_attention_backward_kernels_are_probed_for_their_workspace():
    """On a CUDA trace the flash and memory-efficient SDPA backward kernels are run once to measure their scratch."""
    from torch_skills.memory.probes import KernelProbe

    probe = KernelProbe("cpu", scratch=True)
    assert probe.wants(torch.ops.aten._scaled_dot_product_efficient_attention_backward.default)
    assert probe.wants(torch.ops.aten._scaled_dot_product_flash_attention_backward.default)


def encoder_768():
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)


def encoder_tokens(batch_size=None):
    return torch.randn(batch_size or 16, 512, 768)  # (B, T, C)


@pytest.mark.parametrize(("precision", "measured_mib"), [("fp32", 333.2), ("bf16", 184.0)])
def test_the_fused_transformer_encoder_inference_is_within_3_percent_of_the_h100(precision, measured_mib):
    """nn.TransformerEncoder in eval (one fused op per layer): the CUDA estimate is within 3% of max_memory_allocated on an H100."""
    spec = StepSpec(mode="inference", optimizer="none", precision=precision)
    trace = trace_step(encoder_768, encoder_tokens, mean_loss, spec, cuda_kernels=CudaKernelModel(H100))
    assert any(tag == OP and value.op == "_transformer_encoder_layer_fwd" for tag, value in trace.events)
    est = estimate_trace(trace, Target(cuda=True, hopper=True, training=False))
    assert est.workspace_bytes == SM90_CUBLAS + LT  # its Linears run inside the fused op
    assert abs(est.peak_allocated / 2**20 - measured_mib) / measured_mib < 0.03


class ScriptedMeter:
    """Stands in for CudaScratchMeter: reports the same in-op peak for every op."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    def start(self) -> None:
        pass

    def stop(self) -> int:
        return self.nbytes


def test_a_real_cuda_step_records_each_ops_measured_workspace_instead_of_the_model():
    """With a meter (real steps on the GPU, the fallback when fake tracing fails) the measured in-op peak is the scratch."""
    from torch_skills.memory.ledger import StorageLedger

    x = torch.zeros(8, 4)
    ledger = StorageLedger(meter=ScriptedMeter(28 * 2**20), kernels=CudaKernelModel(H100))
    with ledger:
        x.sum(0)
    allocs = [value.nbytes for tag, value in ledger.events if tag == ALLOC]
    assert 28 * 2**20 in allocs
    assert [value.op for tag, value in ledger.events if tag == OP] == ["sum (kernel scratch)", "sum"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_real_lstm_step_records_the_cudnn_workspace():
    """A real (not fake) LSTM training step on CUDA records cuDNN's in-op workspace, which a storage ledger misses."""
    from tests.fixtures import memory_models as zoo

    spec = StepSpec(optimizer="adamw", foreach=True)
    trace = trace_step(
        zoo.build_lstm, zoo.lstm_inputs, mean_loss, spec, device="cuda", batch_size=16, fake=False
    )
    assert any(tag == OP and value.op == "_cudnn_rnn (kernel scratch)" for tag, value in trace.events)
    # A CUDA trace in this process must leave the default device as it found it: on an H200 run a later
    # test in the same process built its model on cuda:0 (tests/fixtures/checkpoint_corpus.py).
    assert torch.get_default_device().type == "cpu" and torch._C._len_torch_function_stack() == 0


def test_the_weight_transposes_of_a_deep_copied_encoder_are_views_not_new_memory():
    """nn.TransformerEncoder deep-copies its layer: the fake trace must see each weight's t() as a view of it (+4.8% on the H100 before)."""

    def encoder():
        layer = torch.nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
        return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    trace = trace_step(encoder, lambda b=None: torch.randn(2, 16, 64), mean_loss, StepSpec(optimizer="sgd"))
    allocated_by = []
    pending = []
    for tag, value in trace.events:
        if tag == ALLOC:
            pending.append(value.nbytes)
        elif tag == OP:
            if value.op == "t" and pending:
                allocated_by.append(pending)
            pending = []
    assert allocated_by == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "width"), [(6304, 384), (6304, 1536), (4096, 8192), (8, 4096)])
def test_on_a_gpu_the_reduction_model_matches_the_allocator_inside_sum(rows, width, dtype):
    """On the local GPU, the in-op peak of sum(0) above its input and output is what the model says for this GPU."""
    from torch_skills.memory.allocator import K_SMALL_SIZE, round_size
    from torch_skills.memory.probes import CudaScratchMeter

    x = torch.zeros(rows, width, dtype=dtype, device="cuda")
    x.sum(0)  # warm up: the kernel's first launch may load modules
    meter = CudaScratchMeter("cuda")
    meter.start()
    y = x.sum(0)  # kept alive, so the meter counts the buffers only, not the output
    measured = meter.stop()
    del y
    expected = sum(round_size(n) for n in outer_reduction_buffers(rows, width, 4, GpuSpec.local_or_default()))
    # a cached block is handed out whole when what is left of it is under 1 MiB (should_split)
    assert expected <= measured <= expected + (K_SMALL_SIZE if expected else 0)
