"""A tiny random-weight VoxCPM2 model directory, in the layout ``voxcpm==2.0.3`` reads.

No VoxCPM weights can be downloaded where the GPU check runs, yet the check wants the
package's real loading and generation code on the device (memory, leaks, recycling).
:func:`build_tiny_voxcpm2` writes what ``voxcpm.model.VoxCPM2Model.from_local(path)``
reads, with the real architecture shrunk to a few hundred thousand parameters:

- ``config.json``: voxcpm's pydantic ``VoxCPMConfig`` as it dumps itself (no nulls), with
  ``architecture``; the real model's structure (MiniCPM-4 text LM with LongRoPE, residual
  LM, local encoder, local DiT with its flow-matching sampler, the 16 kHz -> 48 kHz causal
  AudioVAE V2 with the same strides) with widths of tens and one layer each;
- ``model.safetensors`` (bfloat16, the config's dtype) and ``audiovae.safetensors``
  (float32): seeded random weights, made by voxcpm's own modules so the names and shapes
  are exactly the ones it loads;
- ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``: a
  Llama-style BPE tokenizer (``<unk>``, ``<s>``, ``</s>``, the 256 byte-fallback
  tokens, ``▁`` and printable ASCII) built offline with the ``tokenizers`` library,
  loadable by ``transformers.LlamaTokenizerFast.from_pretrained``.

The audio it makes is noise: use it for memory and leak figures only, never for
quality or speed. Building needs torch, voxcpm (and its imports), tokenizers and
safetensors; it runs on the CPU in a second or two. The package's model module is imported
through synth.engines.voxcpm_package (no torchaudio needed), as the engine imports it.
Used by the device check (tests/gpu/voxcpm_check.py) and the tests' ``voxcpm_model``
fixture (tests/integration/voxcpm/conftest.py).
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

# VoxCPM2's hard-coded special ids (audio start/end, reference start/end) are 101-104,
# so the vocabulary must be larger than that: the byte tokens alone take 3-258.
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
HEAD_DIM = 16  # the LM's head size: LongRoPE wants one factor per pair of dimensions


def tiny_vocab() -> dict[str, int]:
    """Llama's layout: specials, the 256 byte-fallback tokens, then ``▁`` and ASCII."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for char in "▁" + string.ascii_letters + string.digits + string.punctuation:
        vocab.setdefault(char, len(vocab))
    return vocab


def tiny_config(vocab_size: int) -> dict[str, Any]:
    """VoxCPM2's config.json with small widths; the field names are VoxCPMConfig's."""
    rope_factors = [1.0] * (HEAD_DIM // 2)
    return {
        "architecture": "voxcpm2",
        "lm_config": {
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "max_position_embeddings": 4096,
            "num_attention_heads": 4,
            "num_hidden_layers": 1,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-05,
            "rope_theta": 10000.0,
            "rope_scaling": {
                "type": "longrope",
                "long_factor": rope_factors,
                "short_factor": rope_factors,
                "original_max_position_embeddings": 4096,
            },
            "vocab_size": vocab_size,
            "use_mup": False,
            "scale_emb": 1.0,
            "dim_model_base": 64,
            "scale_depth": 1.0,
            "kv_channels": HEAD_DIM,
        },
        "patch_size": 4,
        "feat_dim": 16,
        "residual_lm_num_layers": 1,
        "residual_lm_no_rope": False,
        "scalar_quantization_latent_dim": 16,
        "scalar_quantization_scale": 9,
        "encoder_config": {
            "hidden_dim": 32,
            "ffn_dim": 64,
            "num_heads": 2,
            "num_layers": 1,
            "kv_channels": HEAD_DIM,
        },
        "dit_config": {
            "hidden_dim": 32,
            "ffn_dim": 64,
            "num_heads": 2,
            "num_layers": 1,
            "kv_channels": HEAD_DIM,
            "dit_mean_mode": False,
            "cfm_config": {
                "sigma_min": 1e-06,
                "solver": "euler",
                "t_scheduler": "log-norm",
                "inference_cfg_rate": 2.0,
            },
        },
        # The real VAE's strides (16 kHz in, 640 samples per latent; 48 kHz out), narrow.
        "audio_vae_config": {
            "encoder_dim": 16,
            "encoder_rates": [2, 5, 8, 8],
            "latent_dim": 16,
            "decoder_dim": 64,
            "decoder_rates": [8, 6, 5, 2, 2, 2],
            "depthwise": True,
            "sample_rate": 16000,
            "out_sample_rate": 48000,
            "use_noise_block": False,
            "sr_bin_boundaries": [20000, 30000, 40000],
            "cond_type": "scale_bias",
            "cond_dim": 16,
            "cond_out_layer": False,
        },
        # The KV caches are allocated for this many positions at load: small here.
        "max_length": 512,
        "device": "cuda",
        "dtype": "bfloat16",
    }


def _write_tokenizer(path: Path, vocab: dict[str, int]) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    # Llama's (non-legacy) SentencePiece behaviour: spaces become ▁, one ▁ in front.
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.save(str(path / "tokenizer.json"))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (path / "special_tokens_map.json").write_text(json.dumps(specials, indent=1), encoding="utf-8")
    config = {
        "tokenizer_class": "LlamaTokenizerFast",
        **specials,
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": False,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


def build_tiny_voxcpm2(path: str | Path, seed: int = 0) -> dict[str, Any]:
    """Write a tiny random-weight VoxCPM2 model directory at ``path``; returns its description.

    The weights come from voxcpm's own modules, initialised under ``torch.manual_seed(seed)``
    on the CPU in float32 (the LM's saved in bfloat16), so the same seed and voxcpm/torch
    versions give the same files.
    """
    import contextlib
    import io

    import torch
    from safetensors.torch import save_file
    from transformers import LlamaTokenizerFast

    from synth.engines.voxcpm_package import model_module

    v2 = model_module("voxcpm2")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    vocab = tiny_vocab()
    _write_tokenizer(out, vocab)
    parsed = v2.VoxCPMConfig.model_validate(tiny_config(len(vocab)))
    # The package's own dump, nulls left out (a null would not validate as an int field back).
    config = {"architecture": "voxcpm2", **parsed.model_dump(mode="json", exclude_none=True)}
    (out / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")

    # Build through the package's constructor (as from_local does), on the CPU in float32.
    parsed.dtype = "float32"
    tokenizer = LlamaTokenizerFast.from_pretrained(str(out))
    torch.manual_seed(seed)
    audio_vae = v2.AudioVAEV2(config=v2.AudioVAEConfigV2.model_validate(config["audio_vae_config"]))
    with contextlib.redirect_stderr(io.StringIO()):  # "Running on device: ..."
        model = v2.VoxCPM2Model(parsed, tokenizer, audio_vae, device="cpu")
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    vae = {k[len("audio_vae.") :]: v for k, v in state.items() if k.startswith("audio_vae.")}
    # The KV caches are rebuilt at load, not weights; the VAE goes to its own file, in float32.
    main = {k: v.to(torch.bfloat16) for k, v in state.items() if not k.startswith("audio_vae.")}
    save_file(main, str(out / "model.safetensors"))
    save_file(vae, str(out / "audiovae.safetensors"))
    files = sorted(p for p in out.iterdir() if p.is_file())
    return {
        "path": str(out),
        "seed": seed,
        "parameters": sum(int(p.numel()) for p in model.parameters()),
        "parameters_audio_vae": sum(int(p.numel()) for p in audio_vae.parameters()),
        "tensors": len(main) + len(vae),
        "bytes": sum(p.stat().st_size for p in files),
        "files": {p.name: p.stat().st_size for p in files},
        "vocab_size": len(vocab),
    }
