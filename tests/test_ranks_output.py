"""What a rank's program prints (docs/ranks.md, "What the ranks print"), at the Python level: the coordinator hands
each rank's lines to `on_printed`, in order, as the rank answers or ends, while the rank's log keeps everything it
said. Real rank processes, one rank launcher for the module."""

from __future__ import annotations

import pytest

from hardware.errors import RewindError
from hardware.ranks.coordinator import Coordinator
from tests.conftest import MODELS

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
RANKS = MODELS / "ranks"
PRINTS = RANKS / "prints_on_each_rank.py"


class Heard:
    """What the coordinator hands on, by rank: the lines each rank's program printed, and its Session's notes."""

    def __init__(self) -> None:
        self.printed: dict[int, list[str]] = {}
        self.notes: dict[int | None, list[str]] = {}

    def launch(self, launcher, model, **options) -> Coordinator:
        return Coordinator(str(model), 2, launcher=launcher, timeout_s=120, **options,
                           on_printed=lambda rank, lines: self.printed.setdefault(rank, []).extend(lines),
                           on_notes=lambda rank, said: self.notes.setdefault(rank, []).extend(said))


def test_each_ranks_prints_are_heard_in_order_under_its_rank_and_stay_in_its_log(launcher):
    heard = Heard()
    with heard.launch(launcher, PRINTS) as ranks:
        assert heard.printed == {r: [f"loading shard {r} of 2", f"weights: {r + 1} × 4 ✓", "raw \ufffd\ufffd"]
                                 for r in (0, 1)}  # bytes that are no UTF-8 shown as such
        logs = {r: ranks.ranks[r].log.read_text(errors="replace") for r in (0, 1)}
        assert ranks.run().reason == "end"
    assert all(f"loading shard {r} of 2\n" in logs[r] and f"rank {r} warns on stderr" in logs[r] for r in (0, 1))
    assert len(heard.printed[0]) == len(heard.printed[1]) == 3  # stderr stays in the log; nothing twice, nor more


def test_what_a_rank_printed_before_its_process_ended_is_heard(launcher):
    heard = Heard()
    with pytest.raises(RewindError, match=r"rank 1 ended while loading its program \(exit code 3\)"):
        heard.launch(launcher, RANKS / "exits_on_one_rank.py")
    assert heard.printed == {1: ["rank 1 gives up"]}


def test_a_rank_printing_over_a_mebibyte_is_heard_up_to_it_and_says_the_rest_is_not_shown(launcher):
    heard = Heard()
    with heard.launch(launcher, PRINTS, entry="build_chatty"):
        pass
    assert heard.printed == {r: ["x" * 1023] * 1024 for r in (0, 1)}  # 1 MiB of whole lines; the shard's come later
    said = "its program printed more than 1 MiB: the rest is not shown"
    assert heard.notes[0].count(said) == heard.notes[1].count(said) == 1
