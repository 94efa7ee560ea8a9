"""The write log answers who wrote a value or an address, a value's history, and its lineage."""

from pathlib import Path

from tests.conftest import EXAMPLES, line_of, open_session

GPT = EXAMPLES / "gpt.py"


def test_every_write_is_recorded_with_location_digest_and_stats():
    session = open_session(EXAMPLES / "gpt.py")
    session.run()
    log = session.tl.log
    produced = sum(len(n.outputs) for n in session.program.nodes)
    assert len(log) == produced
    rec = log.last_writer(value="linear")
    assert rec.node_name == "linear" and rec.op == "aten.linear.default"
    assert Path(rec.loc.file).name == "gpt.py" and rec.loc.line == line_of(GPT, "q, k, v = self.qkv(x).split")
    assert rec.location.space == "host" and rec.location.nbytes == 1 * 16 * 96 * 4
    assert rec.stats.nan == 0 and rec.stats.min <= rec.stats.mean <= rec.stats.max
    assert rec.location.address == session.locate("linear").shards[0].address


def placed_outputs(session) -> list[tuple[int, str, str, int, int]]:
    """(tick, node, value, address, nbytes) of every output the program writes, in schedule order, each placed by
    the driver (`locate`) at the position after its node ran: what the write log should know, found without it."""
    tl = session.tl
    placed = []
    for tick in range(tl.end):
        node = tl.node_at(tick)
        session.goto(tick + 1)
        for name in node.outputs:
            (shard,) = session.locate(name).shards
            placed.append((tick, node.name, name, shard.address, shard.nbytes))
    return placed


def test_last_writer_of_an_address_at_a_tick():
    session = open_session(GPT)
    session.run()
    tl = session.tl
    placed = placed_outputs(session)

    def expected(address: int, before: int) -> tuple | None:
        """The last output placed over `address` by a node that ran before tick `before` (None: nothing was)."""
        covering = [(tick, node, value) for tick, node, value, start, nbytes in placed
                    if tick < before and start <= address < start + nbytes]
        return covering[-1] if covering else None

    softmax = tl.log.last_writer(value="softmax")
    qkv = tl.log.last_writer(value="linear")  # the fused q, k, v projection, then the views split from it
    probes = {"softmax": softmax.location.address + 100,
              "inside k's view of linear": tl.log.last_writer(value="getitem_1").location.address + 100,
              "a parameter, which no node writes": session.locate("p_head_weight").shards[0].address + 4}
    writers = {}
    for what, address in probes.items():
        writers[what] = []
        for before in range(tl.end + 2):
            rec = tl.log.last_writer(address=address, before=before)
            want = expected(address, before)
            assert (None if rec is None else (rec.tick, rec.node_name, rec.value)) == want, (what, before)
            writers[what].append(want)
    # softmax's bytes: nothing wrote them before its tick, softmax from the tick after it on
    assert writers["softmax"] == [None] * (softmax.tick + 1) + [(softmax.tick, "softmax", "softmax")] * (
        tl.end + 1 - softmax.tick)
    # k's bytes: written by the projection, then viewed again and again (split, view, transpose ...)
    assert writers["inside k's view of linear"][qkv.tick + 1] == (qkv.tick, "linear", "linear")
    assert len({w for w in writers["inside k's view of linear"] if w is not None}) >= 3
    assert writers["a parameter, which no node writes"] == [None] * (tl.end + 2)
    for position in (softmax.tick, softmax.tick + 1, tl.end):
        session.goto(position)
        who = session.who_wrote(probes["softmax"])
        assert (None if who is None else (who.tick, who.node_name)) == (
            None if position <= softmax.tick else (softmax.tick, "softmax"))


def test_lineage_reaches_inputs_and_parameters():
    session = open_session(EXAMPLES / "mlp.py")
    session.run()
    prov = session.provenance("linear_2")
    assert prov["lastWriter"]["node"] == "linear_2"
    assert [n["name"] for n in prov["lineage"]["nodes"]] == ["linear_2", "tanh", "linear_1", "relu", "linear"]
    roots = set(prov["lineage"]["roots"])
    assert "x" in roots and "p_fc1_weight" in roots and "p_fc3_bias" in roots


def test_history_shows_edits_and_truncation_forgets_the_old_future():
    session = open_session(EXAMPLES / "mlp.py")
    session.run()
    tl = session.tl
    assert len(tl.log) == 5
    session.goto(2)
    session.set_element("relu", (0, 0), 7.0)
    hist = tl.log.history("relu")
    assert [r.kind for r in hist] == ["node output", "user edit"]
    assert len(tl.log) == 3  # fc1, relu, the edit: the old future is gone until re-run
    session.run()
    assert len(tl.log) == 6
