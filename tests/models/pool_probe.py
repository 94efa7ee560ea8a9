"""A model whose build() says what its process looks like: the environment variable the test set, the working
directory, and the first numbers torch's and numpy's global generators draw (tests/dap/test_engine_pool.py)."""

import os

import numpy as np
import torch
from torch import nn


def build():
    print(f"probe mark={os.environ.get('REWIND_PROBE_MARK')} cwd={os.getcwd()} pid={os.getpid()} "
          f"torch={torch.rand(1).item():.8f} numpy={np.random.rand():.8f}")
    model = nn.Linear(2, 2)
    return model, (torch.ones(1, 2),)


def build_exit_3():
    os._exit(3)
