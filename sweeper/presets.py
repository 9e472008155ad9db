"""Model size presets for ``workload.model.arch`` + ``size`` (plain data: no torch here).

Each preset is a set of keyword overrides on the architecture's transformers config; the
vocabulary comes from the tokenizer. Parameter counts below assume a 32k vocabulary.
"""

from __future__ import annotations

# ~2.6M params at vocab 8192: trains at a few steps/s on a laptop CPU
_TINY_DECODER: dict[str, int | float | bool] = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}

MODEL_SIZES: dict[str, dict[str, dict[str, int | float | bool]]] = {
    "llama": {
        "tiny": _TINY_DECODER,
        # ~45M params
        "small": {
            "hidden_size": 512,
            "intermediate_size": 1408,
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
        },
        # ~1.1B params (Llama-3.2-1B shape, untied embeddings)
        "1b": {
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "rope_theta": 500000.0,
        },
    },
    # Phi-3's architecture (fused qkv_proj and gate_up_proj: LoRA targets differ from Llama's)
    "phi3": {
        "tiny": _TINY_DECODER,
        # ~3.8B params: microsoft/Phi-3-mini-4k-instruct's shape (vocab 32064, 4K context)
        "mini": {
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "original_max_position_embeddings": 4096,
        },
    },
    "gpt2": {
        "tiny": {"n_embd": 128, "n_layer": 2, "n_head": 4},
        "small": {"n_embd": 512, "n_layer": 8, "n_head": 8},
        "124m": {"n_embd": 768, "n_layer": 12, "n_head": 12},
    },
}
