"""Programs that attack the debugger from inside: each entry is a `build()` the engine must survive or outlive.

Launch with `entry` set to one of these. The DAP tests check that the server keeps serving after each.
"""

import ctypes
import os
import sys
import time

import torch
from torch import nn


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return torch.relu(h) * 2


def build():
    torch.manual_seed(0)
    return Small(), (torch.randn(2, 4),)


def build_exit():
    sys.exit(3)


def build_interrupt():
    raise KeyboardInterrupt


def build_os_exit():
    os._exit(3)


def build_forever():
    while True:
        time.sleep(0.01)


def build_spin():
    while True:  # holds the GIL as much as Python lets it
        pass


def build_segfault():
    ctypes.string_at(0)


def build_chatty():
    chunk = "x" * 1023 + "\n"
    for _ in range(4 * 1024):  # 4 MiB
        print(chunk, end="")
    return build()


def build_big():
    """Large enough that saving its trace takes a while (about 130 MB of values): a save to kill midway."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(16)]), (torch.randn(1024, 1024),)
