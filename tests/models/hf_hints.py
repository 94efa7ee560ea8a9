"""Models that torch.export refuses for a cause users meet, each on a line the tests find by its text."""

import numpy as np
import torch
from torch import nn


def cache_in_outputs():
    """A tiny LLaMA left with use_cache=True (the config's default): it returns its DynamicCache."""
    from transformers import LlamaConfig, LlamaForCausalLM  # only this entry needs transformers (slow to import)

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, bos_token_id=0, eos_token_id=0)
    return LlamaForCausalLM(config).eval(), {"input_ids": torch.randint(0, 64, (1, 8))}


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        y = self.proj(x)
        if y.sum() > 0:  # decides on a tensor's values
            return y * 2
        return y


def data_dependent():
    torch.manual_seed(0)
    return Gate(), (torch.randn(2, 4),)


class Scaled(nn.Module):
    def forward(self, x, scale):
        return x * 2


def numpy_input():
    return Scaled(), (torch.randn(2, 4), np.ones(3))


def object_in_keyword_input():
    return Scaled(), {"x": torch.randn(2, 4), "scale": {"factor": [1.0, object()]}}


def cache_turned_off_by_keyword():
    """The hint followed: the same LLaMA, with use_cache=False passed among its keyword inputs."""
    model, inputs = cache_in_outputs()
    return model, {**inputs, "use_cache": False}


def number_among_inputs():
    """A number among the inputs is fixed at export: the Program's only input is the tensor."""
    return Scaled(), (torch.randn(2, 4), 3.0)
