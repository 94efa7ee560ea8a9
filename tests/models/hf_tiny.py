"""Small transformers models with random weights built here (nothing is downloaded): what a user debugs.

Eager attention, so the pass eager Python runs is the one torch.export records (sdpa takes other branches
when traced) and eager locals can be compared with the engine's names.
"""

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration


def llama():
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, use_cache=False, attn_implementation="eager")
    return LlamaForCausalLM(config).eval(), (torch.randint(0, 64, (1, 8)),)


class Seq2Seq(nn.Module):
    """A T5 inside a module of the user's own: the T5's lines run inside the wrapper's forward."""

    def __init__(self, t5: nn.Module):
        super().__init__()
        self.t5 = t5

    def forward(self, input_ids, decoder_input_ids):
        out = self.t5(input_ids=input_ids, decoder_input_ids=decoder_input_ids, use_cache=False)
        return out.logits


def t5_wrapped():
    torch.manual_seed(0)
    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
                      use_cache=False, attn_implementation="eager")
    return Seq2Seq(T5ForConditionalGeneration(config).eval()).eval(), (torch.randint(0, 64, (1, 6)),
                                                                        torch.randint(0, 64, (1, 4)))
