"""A LLaMA-shaped model of about 1.1B parameters (hidden 2048, 16 layers, MLP 5632, vocab 32000), random weights,
128 tokens: the size benchmarks/scale.py asks about with --llama-1b (not run by default: see RESULTS.md)."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
                         num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    return model, {"input_ids": torch.randint(0, 32000, (1, 128)), "use_cache": False}
