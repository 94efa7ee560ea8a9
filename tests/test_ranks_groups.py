"""Collectives on process groups other than the world (docs/ranks.md, "Process groups"): a DeviceMesh of 2
data-parallel replicas × 2 tensor-parallel shards on 4 real ranks. Each collective pairs with the collectives of its
own group's ranks, a mismatch inside one group is caught naming its ranks, and the groups travel with a recording."""

from __future__ import annotations

import pytest
import torch

from hardware.errors import RewindError
from hardware.ranks.coordinator import Coordinator
from hardware.ranks.traces import read_index
from hardware.ticks import Direction
from tests.conftest import MODELS, fresh_module, line_of

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
MODEL = MODELS / "ranks" / "two_groups.py"
TP_SUM, GATHERS, DP_AVG = (line_of(MODEL, m) for m in ("# TP SUM", "# GATHERS", "# DP AVG"))


def _output(c: Coordinator, rank: int) -> torch.Tensor:
    got = c.tensor(rank, c.outputs(rank)[0])
    return torch.tensor(got["values"]).reshape(got["shape"])


def _members(c: Coordinator) -> set[tuple[int, ...]]:
    return set(c.groups.values())


def test_collectives_on_subgroups_pair_within_their_group_and_every_rank_equals_one_process(launcher, tmp_path):
    index = tmp_path / "mesh.rwtrace"
    with Coordinator(str(MODEL), 4, timeout_s=120, launcher=launcher, record=str(index)) as c:
        assert _members(c) == {(0, 1), (2, 3), (0, 2), (1, 3)}  # the tensor-parallel, then the data-parallel groups
        assert c.partners(0, 1) == {0: 1, 1: 1} and c.partners(0, 2) == {0: 2, 2: 2}
        assert c.run().reason == "end"
        expected = fresh_module(MODEL).reference()
        outputs = {r: _output(c, r) for r in range(4)}
        for r in range(4):
            assert torch.allclose(outputs[r], expected, atol=1e-6)
        groups = dict(c.groups)
    assert read_index(str(index)).groups == groups  # the index keeps them: no process group to ask post-mortem
    with Coordinator(trace=str(index), timeout_s=120, launcher=launcher) as traced:
        assert traced.groups == groups and traced.run().reason == "end"
        assert all(torch.equal(_output(traced, r), outputs[r]) for r in range(4))
        traced.goto(traced.collectives(3)[1].tick, 3)  # back across rank 3's data-parallel average only
        assert [s["passed"] for s in traced.states().values()] == [2, 1, 2, 1]  # its group's rank 1 with it


def test_a_mismatch_inside_one_group_names_its_ranks_while_the_other_group_is_fine(launcher):
    with Coordinator(str(MODEL), 4, entry="mismatch", timeout_s=120, launcher=launcher) as c:
        stop = c.run()
        assert (stop.reason, stop.rank, stop.finding) == ("exception", 2, True)
        assert stop.description == (f"rank 2 calls all_reduce #1 (float32[2,4], sum) at two_groups.py:{TP_SUM}; "
                                    f"rank 3 calls all_gather_into_tensor #1 (float32[2,4]) at two_groups.py:{GATHERS}")
        states = c.states()
        assert states[2]["at_fence"] and states[3]["at_fence"] and states[2]["calls"] == states[3]["calls"] == 0
        assert c.values(3)  # alive and inspectable
        alone = c.step(kind="node", rank=0, single=True)  # rank 0 waits at its own group's sum, with rank 1
        assert alone.description == (f"rank 0: waits before all_reduce #1 (float32[2,4], sum) at two_groups.py:"
                                     f"{TP_SUM}, which runs only with the ranks of its process group (rank 1): alone "
                                     "it stays here (step every rank to run it)")
        assert c.step(Direction.REVERSE).reason == "step" and c.run(Direction.REVERSE).reason == "entry"


def test_a_send_on_a_subgroup_is_refused_at_launch_in_words(launcher, tmp_path):
    model = tmp_path / "send_on_subgroup.py"
    model.write_text("import torch\nimport torch.distributed as dist\n"
                     "import torch.distributed._functional_collectives as funcol\n\n\n"
                     "class M(torch.nn.Module):\n    def __init__(self, group):\n        super().__init__()\n"
                     "        self.group = group\n\n    def forward(self, x):\n"
                     "        funcol.isend_inplace(x, 1, group=self.group)\n        return x\n\n\n"
                     "def build(rank, world_size):\n    group = dist.new_group([0, 1])\n"
                     "    return M(group), (torch.ones(2),)\n")
    with pytest.raises(RewindError, match=r"isend #1 \(float32\[2\] to rank 1\) at send_on_subgroup.py:12 is on a "
                                          r"process group other than the default one: sends and recvs on a subgroup "
                                          r"are not supported yet"):
        Coordinator(str(model), 2, launcher=launcher)
