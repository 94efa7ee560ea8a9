"""A step of the user's own with a GradScaler, returned by train_step() with its inputs: the step closes over its
model, optimizer and scaler, zeroes the gradients through the model, scales the loss, unscales before clipping,
and steps through the scaler."""

import torch
from torch import nn


def train_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)

    def step(x, y):
        model.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x).squeeze(-1), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    x = torch.randn(16, 4)
    return step, (x, x.sum(-1).sin())
