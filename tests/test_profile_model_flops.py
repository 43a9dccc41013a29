"""profile_model's FLOP counts for RNNs and mixture-of-experts layers, checked against the analytic count.

The analytic count of a recurrent layer: every time step multiplies the input and the previous hidden
state by the gate weights, 2 * B * (in + H) * gates * H per step, layer and direction (gates: 4 for
an LSTM, 3 for a GRU); backward computes the input and the weight gradients, twice the forward.
A top-k MoE layer: the router, 2 * N * D * E, plus each token's k experts, 2 * N * k * (3 * D * F)
for a SwiGLU expert; backward twice that wherever both gradients are needed.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo  # noqa: F401 - FlopCounterMode imports it on first use (~2-5 s): pay it at collection, as the worker does
import torch.nn.functional as F
from torch import nn

from torch_skills.profiling.flops import (
    cudnn_rnn_backward_flops,
    cudnn_rnn_flops,
    flop_counter,
    grouped_mm_flops,
)

B, T, IN, H = 4, 16, 32, 64  # batch, time steps, input features, hidden size
TOLERANCE = 0.03  # the analytic counts leave out the first step's zero hidden state and elementwise ops


def rnn_forward_flops(layers: int, gates: int, directions: int = 1) -> int:
    """2 * B * T * (in + H) * gates * H per layer and direction; layer 2 on takes directions * H inputs."""
    total = 0
    for layer in range(layers):
        inputs = IN if layer == 0 else directions * H
        total += directions * 2 * B * T * (inputs + H) * gates * H
    return total


def counted(module: nn.Module, step) -> int:
    """FLOPs flop_counter() sees over `step(module)`."""
    counter = flop_counter()
    with counter:
        step(module)
    return int(counter.get_total_flops())


def train_sequence(module: nn.Module) -> None:
    x = torch.randn(B, T, IN, requires_grad=True)  # as if from an embedding: its gradient is needed
    module(x)[0].sum().backward()


def assert_close(measured: int, analytic: int) -> None:
    assert abs(measured - analytic) <= TOLERANCE * analytic, f"measured {measured:,} vs analytic {analytic:,}"


@pytest.mark.parametrize(
    ("module", "gates", "directions", "layers"),
    [
        (nn.LSTM(IN, H, num_layers=2, batch_first=True), 4, 1, 2),
        (nn.GRU(IN, H, num_layers=2, batch_first=True), 3, 1, 2),
        (nn.LSTM(IN, H, num_layers=1, batch_first=True, bidirectional=True), 4, 2, 1),
        (nn.RNN(IN, H, num_layers=2, batch_first=True), 1, 1, 2),
    ],
    ids=["lstm-2-layers", "gru-2-layers", "bidirectional-lstm", "rnn-tanh-2-layers"],
)
def test_a_recurrent_training_step_counts_its_gate_matmuls_forward_and_backward(
    module, gates, directions, layers
):
    """nn.LSTM/GRU/RNN, fused or decomposed, count three forwards' worth of gate matmuls in a training step."""
    assert_close(counted(module, train_sequence), 3 * rnn_forward_flops(layers, gates, directions))


def test_a_fused_lstm_forward_counts_its_gate_matmuls():
    """The fused CPU LSTM's forward alone counts exactly the analytic gate matmuls."""
    lstm = nn.LSTM(IN, H, num_layers=2, batch_first=True)
    with torch.no_grad():
        assert counted(lstm, lambda m: m(torch.randn(B, T, IN))) == rnn_forward_flops(2, 4)


def test_an_lstm_cell_loop_counts_every_step():
    """An LSTMCell unrolled by hand counts its gate matmuls at every step, forward and backward."""
    cell = nn.LSTMCell(IN, H)

    def step(module: nn.Module) -> None:
        x = torch.randn(T, B, IN, requires_grad=True)
        h = c = torch.zeros(B, H)
        for t in range(T):
            h, c = module(x[t], (h, c))
        h.sum().backward()

    assert_close(counted(cell, step), 3 * rnn_forward_flops(1, 4))


class Expert(nn.Module):
    """A SwiGLU MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LoopMoE(nn.Module):
    """Top-k MoE the Mixtral way: router logits, topk, each expert on its tokens, index_add_ back."""

    def __init__(self, dim: int = 64, hidden: int = 128, experts: int = 4, k: int = 2):
        super().__init__()
        self.gate = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim, hidden) for _ in range(experts))
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # (N, D)
        weights, chosen = torch.topk(F.softmax(self.gate(tokens), dim=-1), self.k, dim=-1)  # (N, k)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(tokens)
        mask = F.one_hot(chosen, num_classes=len(self.experts)).permute(2, 1, 0)  # (E, k, N)
        for e, expert in enumerate(self.experts):
            slot, token = torch.where(mask[e])
            picked = tokens.index_select(0, token)  # (n_e, D)
            out.index_add_(0, token, expert(picked) * weights[token, slot, None])
        return out.reshape(x.shape)


class GroupedMoE(nn.Module):
    """The same layer with experts as 3-D weights run by one grouped matmul (transformers 5's default)."""

    def __init__(self, dim: int = 64, hidden: int = 128, experts: int = 4, k: int = 2):
        super().__init__()
        self.gate = nn.Linear(dim, experts, bias=False)
        self.gate_up = nn.Parameter(torch.randn(experts, dim, 2 * hidden) * dim**-0.5)  # (E, D, 2F)
        self.down = nn.Parameter(torch.randn(experts, hidden, dim) * hidden**-0.5)  # (E, F, D)
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # (N, D)
        weights, chosen = torch.topk(F.softmax(self.gate(tokens), dim=-1), self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        order = chosen.flatten().argsort()  # token slots sorted by expert
        rows = tokens.index_select(0, order // self.k)  # (N*k, D)
        counts = torch.bincount(chosen.flatten(), minlength=self.gate_up.shape[0])
        offs = counts.cumsum(0).to(torch.int32)
        gate, up = torch._grouped_mm(rows, self.gate_up, offs=offs).chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(gate) * up, self.down, offs=offs)  # (N*k, D)
        y = y * weights.flatten()[order, None]
        return torch.zeros_like(tokens).index_add_(0, order // self.k, y).reshape(x.shape)


def moe_forward_flops(tokens: int, dim: int = 64, hidden: int = 128, experts: int = 4, k: int = 2) -> int:
    return 2 * tokens * dim * experts + 2 * tokens * k * 3 * dim * hidden


@pytest.mark.parametrize("layer", [LoopMoE, GroupedMoE], ids=["where-index-add-loop", "grouped-mm"])
def test_a_top2_moe_step_counts_the_expert_matmuls_on_the_routed_tokens(layer):
    """A top-2 of 4 MoE training step counts router plus two experts per token, forward and backward."""
    if layer is GroupedMoE and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    torch.manual_seed(0)
    moe = layer()
    if layer is GroupedMoE:
        try:
            moe(torch.randn(2, 8, 64))
        except RuntimeError as exc:  # the CPU kernel arrived after the op itself
            pytest.skip(f"torch._grouped_mm does not run on this CPU build: {exc}")

    def step(module: nn.Module) -> None:
        module(torch.randn(4, 16, 64, requires_grad=True)).sum().backward()

    assert_close(counted(moe, step), 3 * moe_forward_flops(tokens=64))


@pytest.mark.parametrize(
    ("a", "b", "flops"),
    [
        ((10, 8), (3, 8, 5), 2 * 10 * 8 * 5),  # tokens x per-expert weights
        ((3, 10, 8), (3, 8, 5), 2 * 3 * 10 * 8 * 5),  # batched
        ((8, 10), (10, 5), 2 * 8 * 10 * 5),  # weight gradient: K split into groups
        ((3, 10, 8), (8, 15), 2 * 10 * 8 * 15),  # N split into groups
    ],
)
def test_grouped_matmul_flops_are_those_of_one_matmul_of_the_same_rows(a, b, flops):
    """Each grouped-matmul layout costs 2 * M * K * N over the rows and columns it really multiplies."""
    assert grouped_mm_flops(a, b) == flops


def lstm_weight_shapes(layers: int, inputs: int, hidden: int, proj: int = 0) -> list[tuple[int, ...]]:
    """The flat weight list aten._cudnn_rnn receives: per layer w_ih, w_hh, b_ih, b_hh (and w_hr)."""
    out_size = proj or hidden
    shapes = []
    for layer in range(layers):
        shapes += [
            (4 * hidden, inputs if layer == 0 else out_size),
            (4 * hidden, out_size),
            (4 * hidden,),
            (4 * hidden,),
        ]
        shapes += [(proj, hidden)] if proj else []
    return shapes


def test_cudnn_rnn_flops_are_the_gate_matmuls_over_all_layers():
    """On a GPU one _cudnn_rnn covers every layer: 2 * rows * the numel of its weight matrices (biases left out)."""
    assert cudnn_rnn_flops((B, T, IN), lstm_weight_shapes(2, IN, H)) == rnn_forward_flops(2, 4)
    with_projection = cudnn_rnn_flops((B, T, IN), lstm_weight_shapes(1, IN, H, proj=16))
    assert with_projection == 2 * B * T * (4 * H * IN + 4 * H * 16 + 16 * H)


@pytest.mark.parametrize(
    ("mask", "forwards"), [((True, False, False, True), 2), ((False, False, False, True), 1)]
)
def test_cudnn_rnn_backward_counts_one_forward_per_kind_of_gradient_asked(mask, forwards):
    """Data gradients cost one forward, weight gradients another; output_mask says which were asked."""
    weights = lstm_weight_shapes(2, IN, H)
    backward = cudnn_rnn_backward_flops((B, T, IN), weights, *([None] * 19), list(mask))
    assert backward == forwards * rnn_forward_flops(2, 4)
