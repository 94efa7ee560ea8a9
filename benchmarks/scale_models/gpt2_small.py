"""GPT-2 small (124M, its real configuration), random weights, 128 tokens."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build():
    torch.manual_seed(0)
    config = GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
    config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config).eval()
    return model, {"input_ids": torch.randint(0, 50257, (1, 128)), "use_cache": False}
