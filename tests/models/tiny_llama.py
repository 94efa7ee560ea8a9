"""A Hugging Face Llama as users have it, from a tiny config with random weights (nothing is downloaded): two
decoder layers whose lines are calls (`self.input_layernorm(...)`, `self.self_attn(...)`, `self.mlp(...)`) with
no node of their own, for stepping over calls both ways."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, use_cache=False)
    model = LlamaForCausalLM(config).eval()
    return model, (torch.randint(0, 64, (1, 8)),)
