"""Hugging Face models as users have them: built from tiny configs with random weights (nothing is downloaded),
returned as they are (no wrapper module) with their inputs as keyword arguments. One entry per model family."""

import torch
from transformers import (BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          T5Config, T5ForConditionalGeneration)

VOCAB = 64


def _tokens(n: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, n))


def gpt2():
    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=0,
                        eos_token_id=0, use_cache=False)
    model = GPT2LMHeadModel(config).eval()
    return model, {"input_ids": _tokens(8), "attention_mask": torch.ones(1, 8, dtype=torch.long)}


def llama():
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, use_cache=False)
    model = LlamaForCausalLM(config).eval()
    return model, {"input_ids": _tokens(8)}


def bert():
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=VOCAB, max_position_embeddings=32)
    model = BertForMaskedLM(config).eval()
    return model, {"input_ids": _tokens(8), "attention_mask": torch.ones(1, 8, dtype=torch.long)}


def t5():
    torch.manual_seed(0)
    config = T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16, vocab_size=VOCAB,
                      decoder_start_token_id=0, use_cache=False)
    model = T5ForConditionalGeneration(config).eval()
    return model, {"input_ids": _tokens(8), "decoder_input_ids": _tokens(4)}
