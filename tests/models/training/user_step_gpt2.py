"""A Hugging Face GPT-2 (a tiny config, random weights) fine-tuned by a step written as its examples write one:
the model's output holds the loss when it is given labels, and the step calls backward() and opt.step() on it."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
config = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0,
                    use_cache=False)
model = GPT2LMHeadModel(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(input_ids):
    model.train()
    outputs = model(input_ids=input_ids, labels=input_ids)
    outputs.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return outputs.loss.item()


def batches():
    g = torch.Generator().manual_seed(2)
    while True:
        yield (torch.randint(0, 64, (2, 8), generator=g),)
