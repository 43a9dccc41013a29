"""More zoo families from tiny configs (no downloads): diffusion, PEFT, MoE, SSM, GNN, RNN, audio conv.

Use the factories as the tools' `model=` (`evals/models/zoo_families.py:mixtral`), the `*_batch` /
`*_pair` functions as `inputs=`, and `write_checkpoint(name)` for the verify_checkpoint scenarios.
Each family needs its package (diffusers, peft, torch_geometric, transformers: the `[zoo]` extra)
except the LSTM/GRU seq2seq, which is plain torch. The scenarios are in evals/scenarios/zoo_families.py.

Healthy models, each written the way its library's training scripts use it:
- `unet` / `vae`: diffusers UNet2DConditionModel (cross-attention blocks, denoising MSE on the
  noise) and AutoencoderKL (reconstruction MSE), behind a two-line wrapper that returns `.sample`
  so the batch rule's target is the noise / the image;
- `qwen2_lora`: a Qwen2ForCausalLM wrapped by peft's LoRA on q_proj/v_proj (the base frozen);
- `mixtral`: MixtralForCausalLM, 4 experts, top-2 routing;
- `mamba`: MambaForCausalLM (the pure-torch selective scan on a CPU);
- `gat`: two torch_geometric GATConv layers on a random graph, node classification;
- `lstm_seq2seq` / `gru_seq2seq`: an encoder-decoder with teacher forcing, plain torch;
  `lstm_seq2seq_sparse` has sparse, padded embeddings of an 8,000-token vocabulary
  (`padded_translation_batch`): rows no token used get no gradient, by design;
- `wav2vec2`: Wav2Vec2ForCTC with its 1-D conv feature encoder, LayerDrop off; `wav2vec2_layerdrop`
  has the config's default LayerDrop 0.1 (a layer's parameters get no gradient on some steps).

Broken copies, one seeded bug each:
- `lstm_seq2seq_double_softmax`: the decoder returns softmax probabilities, which the batch
  rule's cross_entropy softmaxes again;
- `wav2vec2` with `ctc_infeasible_batch`: CTC targets longer than the encoder's frames (infinite loss).

Analytic FLOP counts the profile scenarios compare with (2 FLOPs per multiply-add, forward + backward
= 3x forward for the matmuls): `lstm_flops`, `mixtral_flops`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 128
SEQ = 16


# -- diffusers (the [zoo] extra) ------------------------------------------------------------------
class Denoiser(nn.Module):
    """A diffusion training step's model call: predict the noise in `noisy` at `timesteps`."""

    def __init__(self, unet: nn.Module) -> None:
        super().__init__()
        self.unet = unet

    def forward(self, noisy: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self.unet(noisy, timesteps, encoder_hidden_states=context).sample  # (B, 4, H, W)


def unet() -> nn.Module:
    from diffusers import UNet2DConditionModel

    return Denoiser(
        UNet2DConditionModel(
            sample_size=16,
            in_channels=4,
            out_channels=4,
            layers_per_block=1,
            block_out_channels=(32, 64),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=32,
            attention_head_dim=8,
            norm_num_groups=8,
        )
    )


def unet_batch(batch_size: int = 2) -> tuple[torch.Tensor, ...]:
    """(noisy latents, timesteps, text states, the noise): the last is the MSE target."""
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(batch_size, 4, 16, 16, generator=g)
    latents = torch.randn(batch_size, 4, 16, 16, generator=g)
    timesteps = torch.randint(0, 1000, (batch_size,), generator=g)
    context = torch.randn(batch_size, 8, 32, generator=g)  # (B, tokens, cross_attention_dim)
    return latents + noise, timesteps, context, noise


class Reconstruct(nn.Module):
    """An autoencoder's training call: encode, decode the posterior's mode, return the image."""

    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.vae(images).sample  # (B, 3, H, W)


def vae() -> nn.Module:
    from diffusers import AutoencoderKL

    return Reconstruct(
        AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
            block_out_channels=(16, 32),
            latent_channels=4,
            norm_num_groups=8,
            sample_size=32,
        )
    )


def vae_batch(batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, images): the reconstruction target is the input."""
    images = torch.rand(batch_size, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    return images, images.clone()


# -- transformers + peft ---------------------------------------------------------------------------
def _qwen2_config():
    from transformers import Qwen2Config

    return Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
    )


def qwen2() -> nn.Module:
    from transformers import Qwen2ForCausalLM

    return Qwen2ForCausalLM(_qwen2_config())


LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}


def qwen2_lora() -> nn.Module:
    """Qwen2 wrapped by peft's LoRA: only the adapters train (torch.manual_seed fixes the base)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    return get_peft_model(qwen2(), LoraConfig(task_type="CAUSAL_LM", **LORA))


MIXTRAL = {"hidden": 64, "ffn": 128, "layers": 2, "experts": 4, "top_k": 2, "heads": 2, "kv_heads": 1}


def mixtral() -> nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    m = MIXTRAL
    return MixtralForCausalLM(
        MixtralConfig(
            hidden_size=m["hidden"],
            intermediate_size=m["ffn"],
            num_hidden_layers=m["layers"],
            num_attention_heads=m["heads"],
            num_key_value_heads=m["kv_heads"],
            num_local_experts=m["experts"],
            num_experts_per_tok=m["top_k"],
            vocab_size=VOCAB,
            max_position_embeddings=64,
            bos_token_id=0,
            eos_token_id=0,
        )
    )


def mamba() -> nn.Module:
    from transformers import MambaConfig, MambaForCausalLM

    return MambaForCausalLM(
        MambaConfig(
            hidden_size=64,
            state_size=8,
            num_hidden_layers=2,
            expand=2,
            conv_kernel=4,
            vocab_size=VOCAB,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
        )
    )


def wav2vec2(layerdrop: float = 0.0) -> nn.Module:
    """Wav2Vec2ForCTC; at the default layerdrop=0 every step runs the same layers (a fixed memory peak)."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    return Wav2Vec2ForCTC(
        Wav2Vec2Config(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            conv_dim=(32, 32, 32),
            conv_stride=(5, 2, 2),
            conv_kernel=(10, 3, 3),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2,
            vocab_size=32,
            pad_token_id=0,
            ctc_loss_reduction="mean",
            layerdrop=layerdrop,
        )
    )


def wav2vec2_layerdrop() -> nn.Module:
    """Wav2Vec2ForCTC with the config's default LayerDrop 0.1: a layer skipped at random in training."""
    return wav2vec2(layerdrop=0.1)


AUDIO_SAMPLES = 4000  # -> 199 encoder frames through strides 5, 2, 2 and kernels 10, 3, 3


def ctc_batch(batch_size: int = 2) -> dict:
    """{'input_values', 'labels'}: 1-D audio and 20-token transcripts; Wav2Vec2ForCTC computes its CTC loss."""
    g = torch.Generator().manual_seed(0)
    return {
        "input_values": torch.randn(batch_size, AUDIO_SAMPLES, generator=g),
        "labels": torch.randint(1, 32, (batch_size, 20), generator=g),
    }


def ctc_infeasible_batch(batch_size: int = 2) -> dict:
    """Transcripts of 400 tokens for 199 frames: CTC has no alignment, the loss is inf."""
    batch = ctc_batch(batch_size)
    batch["labels"] = torch.randint(1, 32, (batch_size, 400), generator=torch.Generator().manual_seed(1))
    return batch


def lm_batch(batch_size: int = 2) -> dict:
    """{'input_ids', 'labels'}: the model computes its own loss (output.loss)."""
    ids = torch.randint(1, VOCAB, (batch_size, SEQ), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


# -- torch_geometric -------------------------------------------------------------------------------
class GAT(nn.Module):
    """Two GATConv layers (4 heads, then 1), node classification as in PyG's examples."""

    def __init__(self, features: int = 16, hidden: int = 8, heads: int = 4, classes: int = 5) -> None:
        super().__init__()
        from torch_geometric.nn import GATConv

        self.conv1 = GATConv(features, hidden, heads=heads)
        self.conv2 = GATConv(hidden * heads, classes, heads=1)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.elu(self.conv1(x, edge_index))  # (N, hidden * heads)
        return self.conv2(x, edge_index)  # (N, classes)


def gat() -> nn.Module:
    return GAT()


def graph_batch(batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(node features, edge_index, labels) of a random graph with `batch_size` nodes, 4 edges each."""
    g = torch.Generator().manual_seed(0)
    nodes = batch_size
    src = torch.arange(nodes).repeat_interleave(4)
    dst = torch.randint(0, nodes, (nodes * 4,), generator=g)
    return (
        torch.randn(nodes, 16, generator=g),
        torch.stack([src, dst]),  # (2, E)
        torch.randint(0, 5, (nodes,), generator=g),
    )


# -- plain torch: an LSTM/GRU encoder-decoder ------------------------------------------------------
class Seq2Seq(nn.Module):
    """Encoder and decoder RNNs (2 layers), teacher forcing: forward(src, tgt_in) -> logits (B, T, V)."""

    def __init__(
        self,
        cell: str = "lstm",
        width: int = 64,
        layers: int = 2,
        sparse: bool = False,
        vocab: int = VOCAB,
        padding_idx: int | None = None,
    ) -> None:
        super().__init__()
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.src_embed = nn.Embedding(vocab, width, sparse=sparse, padding_idx=padding_idx)
        self.tgt_embed = nn.Embedding(vocab, width, sparse=sparse, padding_idx=padding_idx)
        self.encoder = rnn(width, width, num_layers=layers, batch_first=True)
        self.decoder = rnn(width, width, num_layers=layers, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        _, state = self.encoder(self.src_embed(src))  # final (h, c) of every layer
        out, _ = self.decoder(self.tgt_embed(tgt_in), state)  # (B, T, width)
        return self.head(out)  # (B, T, V)


class DoubleSoftmax(Seq2Seq):
    """The seeded bug: probabilities returned where the loss expects logits."""

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return super().forward(src, tgt_in).softmax(-1)


def lstm_seq2seq() -> nn.Module:
    return Seq2Seq("lstm")


def gru_seq2seq() -> nn.Module:
    return Seq2Seq("gru")


WIDE_VOCAB = 8000


def lstm_seq2seq_sparse() -> nn.Module:
    """Sparse, padded embeddings of an 8,000-token vocabulary: a batch looks up a few hundred rows."""
    return Seq2Seq("lstm", sparse=True, vocab=WIDE_VOCAB, padding_idx=0)


def lstm_seq2seq_double_softmax() -> nn.Module:
    return DoubleSoftmax("lstm")


def translation_batch(batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(source ids, target ids in, target ids out shifted by one): 32 tokens each."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(1, VOCAB, (batch_size, 32), generator=g)
    tgt = torch.randint(1, VOCAB, (batch_size, 33), generator=g)
    return src, tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous()


def padded_translation_batch(batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As translation_batch over the 8,000-token vocabulary, right-padded with id 0 after 24 tokens."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(1, WIDE_VOCAB, (batch_size, 32), generator=g)
    tgt = torch.randint(1, WIDE_VOCAB, (batch_size, 33), generator=g)
    src[:, 24:] = 0
    tgt[:, 25:] = 0
    return src, tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous()


# -- analytic FLOPs ---------------------------------------------------------------------------------
def rnn_flops(gates: int, batch: int = 8, steps: int = 32, width: int = 64, layers: int = 2) -> int:
    """Forward+backward matmul FLOPs of Seq2Seq on translation_batch: gates*H x (in + H) per row and layer,
    for encoder and decoder, plus the vocabulary head; backward = 2x forward."""
    rows = batch * steps
    rnn = 2 * rows * layers * gates * width * (width + width)  # input and hidden products, one RNN
    head = 2 * rows * width * VOCAB
    return 3 * (2 * rnn + head)


def mixtral_flops(batch: int = 2, seq: int = SEQ) -> int:
    """Forward+backward matmul FLOPs of `mixtral` on lm_batch: each token meets top_k experts' three
    (H x F) matmuls, q/k/v/o projections, attention's two (T x T x head) products, the router and the head."""
    m, tokens = MIXTRAL, batch * seq
    h, f, head_dim = m["hidden"], m["ffn"], m["hidden"] // m["heads"]
    kv = m["kv_heads"] * head_dim
    proj = 2 * tokens * h * (h + 2 * kv + h)  # q, k, v, o
    attention = 2 * 2 * batch * m["heads"] * seq * seq * head_dim  # scores and weighted sum, full matrix
    experts = 2 * tokens * m["top_k"] * 3 * h * f  # gate, up, down of each chosen expert
    router = 2 * tokens * h * m["experts"]
    lm_head = 2 * tokens * h * VOCAB
    return 3 * (m["layers"] * (proj + attention + experts + router) + lm_head)


# -- checkpoints for verify_checkpoint -------------------------------------------------------------
CHECKPOINTS = Path(__file__).with_name("zoo_checkpoints") / "families"  # generated, git-ignored


def write_checkpoint(name: str, folder: Path = CHECKPOINTS) -> Path:
    """Save `name`'s checkpoint (idempotent): `<name>.pt` from torch.save(model.state_dict()), or for
    `qwen2_lora` the folder peft's save_pretrained writes (adapter_config.json, adapter_model.safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if name == "qwen2_lora":
        target = folder / name
        if not (target / "adapter_config.json").exists():
            with warnings.catch_warnings():  # peft 0.21 calls a transformers 5 name deprecated for v6
                warnings.simplefilter("ignore", FutureWarning)
                qwen2_lora().save_pretrained(target)
        return target
    target = folder / f"{name}.pt"
    if not target.exists():
        torch.save(globals()[name]().state_dict(), target)
    return target
