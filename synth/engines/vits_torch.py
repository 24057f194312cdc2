"""Piper's VITS model in PyTorch: built from a voice's config, weights read from its .onnx.

The model code is piper-tts's own (``piper.train.vits.models.SynthesizerTrn``);
this module builds it with the hyperparameters of the voice's quality, loads
the inference weights out of the ONNX graph the voice ships, and runs a
batched, length-masked forward pass. Imported only by the torch engine (and
the GPU check): it imports torch at module level, so the web tier never does.

Weights: most ONNX initializers carry the parameter's name
(``enc_p.encoder.attn_layers.0.conv_q.weight``). The rest are found through
the graph node that consumes them: ``/flow/flows.6/enc/in_layers.0/Conv``
input 1 is ``flow.flows.6.enc.in_layers.0.weight`` (weight-normalised convs
were folded into plain weights on export, so weight norm is removed here
first); the token embedding is the ``Gather`` of ``/enc_p/emb``; the
duration predictor's first affine flow kept only ``exp(-logs)``. Training-only
parts (posterior encoder, the duration predictor's posterior flows and the
flow inference skips) are dropped, and :func:`load_onnx_weights` refuses a
model where any remaining parameter was not found.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from synth.errors import EngineUnavailable

# Hyperparameters per Piper quality (piper.train defaults are "medium"; "high" has the larger decoder).
_DECODER_SMALL: dict[str, Any] = {
    "resblock": "2",
    "resblock_kernel_sizes": (3, 5, 7),
    "resblock_dilation_sizes": ((1, 2), (2, 6), (3, 12)),
    "upsample_rates": (8, 8, 4),
    "upsample_initial_channel": 256,
    "upsample_kernel_sizes": (16, 16, 8),
}
_DECODER_LARGE: dict[str, Any] = {
    "resblock": "1",
    "resblock_kernel_sizes": (3, 7, 11),
    "resblock_dilation_sizes": ((1, 3, 5), (1, 3, 5), (1, 3, 5)),
    "upsample_rates": (8, 8, 2, 2),
    "upsample_initial_channel": 512,
    "upsample_kernel_sizes": (16, 16, 4, 4),
}
_ENCODER_MEDIUM = {"inter_channels": 192, "hidden_channels": 192, "filter_channels": 768}
_ENCODER_X_LOW = {"inter_channels": 96, "hidden_channels": 96, "filter_channels": 384}
QUALITIES: dict[str, dict[str, Any]] = {
    "x_low": {**_ENCODER_X_LOW, **_DECODER_SMALL},
    "low": {**_ENCODER_MEDIUM, **_DECODER_SMALL},
    "medium": {**_ENCODER_MEDIUM, **_DECODER_SMALL},
    "high": {**_ENCODER_MEDIUM, **_DECODER_LARGE},
}
_FIXED = {"n_heads": 2, "n_layers": 6, "kernel_size": 3, "p_dropout": 0.1, "spec_channels": 513}
_TRAINING_ONLY = ("enc_q.", "dp.post_", "dp.flows.1.")


def hparams_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """SynthesizerTrn keyword arguments for a voice's parsed ``.onnx.json``."""
    quality = str(config.get("audio", {}).get("quality") or "medium").replace("-", "_")
    if quality not in QUALITIES:
        raise EngineUnavailable(f"Piper quality {quality!r} is not known to the torch runtime")
    if int(config.get("num_speakers", 1)) > 1:
        raise EngineUnavailable("multi-speaker Piper voices are not supported by the torch runtime")
    return {"n_vocab": int(config["num_symbols"]), **_FIXED, **QUALITIES[quality]}


def build_model(hparams: dict[str, Any]) -> Any:
    """An inference-only SynthesizerTrn: weight norm removed, training-only parts dropped."""
    from piper.train.vits.models import SynthesizerTrn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # piper's model code uses the older weight_norm
        model: Any = SynthesizerTrn(segment_size=32, n_speakers=1, gin_channels=0, use_sdp=True, **hparams)
    model.dec.remove_weight_norm()
    for flow in model.flow.flows:
        if hasattr(flow, "enc"):
            flow.enc.remove_weight_norm()
    del model.enc_q
    for name in ("post_pre", "post_proj", "post_convs", "post_flows"):
        delattr(model.dp, name)
    model.dp.flows[1] = nn.Identity()  # the reverse pass skips this flow (VITS's "useless vflow")
    return model.eval()


# --------------------------------------------------------------------------- weights from ONNX


def _consumer_targets(graph: Any, initializers: set[str]) -> dict[str, str]:
    """Initializer name -> parameter name, for initializers named after their graph node."""
    inputs_by_op = {"Conv": {1: "weight", 2: "bias"}, "ConvTranspose": {1: "weight", 2: "bias"}}
    found: dict[str, str] = {}
    for node in graph.node:
        module = ".".join(node.name.strip("/").split("/")[:-1])
        for index, name in enumerate(node.input):
            if name not in initializers:
                continue
            if node.op_type in inputs_by_op and index in inputs_by_op[node.op_type]:
                found[name] = f"{module}.{inputs_by_op[node.op_type][index]}"
            elif node.op_type == "Gather" and index == 0 and module == "enc_p.emb":
                found[name] = "enc_p.emb.weight"
            elif node.op_type == "Mul" and module == "dp.flows.0" and name.endswith("Exp_output_0"):
                found[name] = "dp.flows.0.logs"  # folded exp(-logs)
    return found


def load_onnx_weights(model: nn.Module, onnx_path: str) -> set[str]:
    """Copy a voice's weights from its ONNX graph into ``model``; the parameter names set.

    Raises EngineUnavailable when a parameter is missing or a shape disagrees.
    """
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(onnx_path).graph
    tensors = {t.name: t for t in graph.initializer}
    state = model.state_dict()
    targets = {name: name for name in tensors if name in state}
    targets.update({k: v for k, v in _consumer_targets(graph, set(tensors)).items() if k not in targets})
    loaded: set[str] = set()
    with torch.no_grad():
        for source, target in targets.items():
            if target not in state:
                continue
            value = torch.from_numpy(numpy_helper.to_array(tensors[source]).copy()).float()
            if target == "dp.flows.0.logs":
                value = -torch.log(value)
            if tuple(value.shape) != tuple(state[target].shape):
                raise EngineUnavailable(
                    f"{onnx_path}: {target} has shape {tuple(value.shape)}, the model {tuple(state[target].shape)}"
                )
            state[target].copy_(value)
            loaded.add(target)
    missing = sorted(set(state) - loaded)
    if missing:
        raise EngineUnavailable(f"{onnx_path}: no weights for {len(missing)} parameters, e.g. {missing[:3]}")
    return loaded


def inference_parameter_names(model: nn.Module) -> set[str]:
    """Every tensor the inference pass reads (training-only parts are already gone)."""
    names = set(model.state_dict())
    assert not any(n.startswith(_TRAINING_ONLY) for n in names)
    return names


def load_voice(onnx_path: str, config_path: str) -> tuple[nn.Module, dict[str, Any]]:
    """Model (float32, CPU) and hyperparameters for a Piper voice's .onnx / .onnx.json."""
    with open(config_path, encoding="utf-8") as fh:
        hparams = hparams_from_config(json.load(fh))
    model = build_model(hparams)
    load_onnx_weights(model, onnx_path)
    return model, hparams


def save_prepared(model: nn.Module, hparams: dict[str, Any], path: str) -> None:
    """The inference weights in fp16 plus hyperparameters: what a GPU check machine loads."""
    state = {k: v.detach().to(torch.float16) for k, v in model.state_dict().items()}
    torch.save({"hparams": hparams, "state_dict": state}, path)


def load_prepared(path: str) -> tuple[nn.Module, dict[str, Any]]:
    blob = torch.load(path, map_location="cpu", weights_only=True)
    hparams = dict(blob["hparams"])
    for key in ("resblock_kernel_sizes", "upsample_rates", "upsample_kernel_sizes"):
        hparams[key] = tuple(hparams[key])
    hparams["resblock_dilation_sizes"] = tuple(tuple(d) for d in hparams["resblock_dilation_sizes"])
    model = build_model(hparams)
    model.load_state_dict({k: v.float() for k, v in blob["state_dict"].items()}, strict=True)
    return model, hparams


# --------------------------------------------------------------------------- batched inference


@dataclass
class Utterance:
    """One sentence's input: phoneme ids, scales, and the RNG its noise comes from."""

    phoneme_ids: Sequence[int]
    noise_scale: float
    length_scale: float
    noise_w: float
    generator: torch.Generator | None = None  # None: torch's global RNG
    durations: Sequence[int] | None = None  # frames per phoneme id, to reuse another run's


@dataclass
class Output:
    audio: Any  # float32 numpy array
    durations: list[int]  # frames per phoneme id


def _noise(shape: tuple[int, int], generator: torch.Generator | None) -> torch.Tensor:
    # Drawn on the CPU per utterance: the same generator gives the same noise on any
    # device and in any batch, so a job's audio does not depend on what it was batched with.
    return torch.randn(shape, generator=generator, dtype=torch.float32)


def _padded(rows: list[torch.Tensor], length: int) -> torch.Tensor:
    return torch.stack([F.pad(r, (0, length - r.shape[-1])) for r in rows])


def _durations(
    model: nn.Module, batch: list[Utterance], x: torch.Tensor, x_mask: torch.Tensor
) -> torch.Tensor:
    """Frames per phoneme id [b, 1, t], from the stochastic duration predictor (float32)."""
    dp: Any = model.dp
    t = x.shape[2]
    x, x_mask = x.float(), x_mask.float()
    h = dp.proj(dp.convs(dp.pre(x), x_mask)) * x_mask
    z = _padded([_noise((2, len(u.phoneme_ids)), u.generator) for u in batch], t).to(x.device)
    z = z * torch.tensor([u.noise_w for u in batch], device=x.device)[:, None, None]
    flows = list(reversed(dp.flows))
    for flow in flows[:-2] + [flows[-1]]:
        z = flow(z, x_mask, g=h, reverse=True)
    length_scale = torch.tensor([u.length_scale for u in batch], device=x.device)[:, None, None]
    w = torch.ceil(torch.exp(z[:, :1]) * x_mask * length_scale)
    for i, u in enumerate(batch):
        if u.durations is not None:
            w[i, 0] = 0
            w[i, 0, : len(u.durations)] = torch.tensor(list(u.durations), dtype=w.dtype)
    return w


def _decode(dec: Any, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """HiFi-GAN decoder with the padding masked after every layer.

    Piper's Generator.forward masks nothing; alone a sentence ends at the
    convolutions' zero padding, so masking here makes a padded batch row
    compute what that sentence computes alone.
    """
    x = dec.conv_pre(z) * mask
    kernels = dec.num_kernels
    for i, up in enumerate(dec.ups):
        x = up(F.leaky_relu(x, dec.LRELU_SLOPE))
        mask = torch.repeat_interleave(mask, up.stride[0], dim=2)
        x = x * mask
        x = sum(dec.resblocks[i * kernels + j](x, mask) for j in range(kernels)) / kernels
    return torch.tanh(dec.conv_post(F.leaky_relu(x))) * mask


def infer(model: Any, batch: list[Utterance], device: str, dtype: torch.dtype) -> list[Output]:
    """Synthesise utterances in one padded forward pass; one Output per utterance, in order.

    The duration predictor and the alignment run in float32 whatever ``dtype``
    (frame counts must not round differently in fp16); the rest in ``dtype``.
    """
    from piper.train.vits import commons

    lengths = torch.tensor([len(u.phoneme_ids) for u in batch], device=device)
    t = int(lengths.max())
    ids = _padded([torch.tensor(list(u.phoneme_ids), dtype=torch.long) for u in batch], t).to(device)
    x, m_p, logs_p, x_mask = model.enc_p(ids, lengths)
    w = _durations(model, batch, x, x_mask)
    y_lengths = torch.clamp_min(torch.sum(w, [1, 2]), 1).long()
    y_mask = torch.unsqueeze(commons.sequence_mask(y_lengths, int(y_lengths.max())), 1).float()
    attn = commons.generate_path(w, x_mask.float().unsqueeze(2) * y_mask.unsqueeze(-1)).squeeze(1).to(dtype)
    m_p = torch.matmul(attn, m_p.transpose(1, 2)).transpose(1, 2)
    logs_p = torch.matmul(attn, logs_p.transpose(1, 2)).transpose(1, 2)
    channels, frames = m_p.shape[1], m_p.shape[2]
    eps = _padded(
        [_noise((channels, int(n)), u.generator) for u, n in zip(batch, y_lengths, strict=True)], frames
    )
    scales = torch.tensor([u.noise_scale for u in batch], device=device)[:, None, None]
    z_p = m_p + eps.to(device, dtype) * torch.exp(logs_p) * scales.to(dtype)
    y_mask = y_mask.to(dtype)
    z = model.flow(z_p, y_mask, g=None, reverse=True)
    audio = _decode(model.dec, z * y_mask, y_mask)[:, 0].float().cpu().numpy()
    hop = math.prod(up.stride[0] for up in model.dec.ups)
    return [
        Output(audio[i, : int(y_lengths[i]) * hop], [int(d) for d in w[i, 0, : len(u.phoneme_ids)].tolist()])
        for i, u in enumerate(batch)
    ]


def place(model: Any, device: str, dtype: torch.dtype) -> Any:
    """Move ``model`` to ``device`` in ``dtype``, keeping the duration predictor in float32."""
    model.to(device=device, dtype=dtype)
    model.dp.float()
    return model
