"""The write log answers who wrote a value or an address, a value's history, and its lineage."""

from pathlib import Path

from tests.conftest import EXAMPLES, open_session


def test_every_write_is_recorded_with_location_digest_and_stats():
    session = open_session(EXAMPLES / "gpt.py")
    session.run()
    log = session.tl.log
    produced = sum(len(n.outputs) for n in session.program.nodes)
    assert len(log) == produced
    rec = log.last_writer(value="linear")
    assert rec.node_name == "linear" and rec.op == "aten.linear.default"
    assert Path(rec.loc.file).name == "gpt.py" and rec.loc.line == 22
    assert rec.location.space == "host" and rec.location.nbytes == 1 * 16 * 96 * 4
    assert rec.stats.nan == 0 and rec.stats.min <= rec.stats.mean <= rec.stats.max
    assert rec.location.address == session.locate("linear").shards[0].address


def test_last_writer_of_an_address_at_a_tick():
    session = open_session(EXAMPLES / "gpt.py")
    session.run()
    tl = session.tl
    target = tl.log.last_writer(value="softmax")
    inside = target.location.address + 100
    assert tl.log.last_writer(address=inside, before=target.tick + 1).value == "softmax"
    assert tl.log.last_writer(address=inside, before=target.tick) is None or \
        tl.log.last_writer(address=inside, before=target.tick).tick < target.tick
    session.goto(target.tick + 1)
    assert session.who_wrote(inside).node_name == "softmax"


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
