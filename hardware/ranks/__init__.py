"""Many ranks of one torch.distributed program as one debug session (docs/ranks.md).

  launcher.py      one process that imports torch once and forks the ranks' engine processes
  worker.py        a rank's engine process: joins the gloo process group, runs a Session over its program
  pipe.py          JSON lines between the coordinator and a rank
  collectives.py   a rank's collectives, matched across ranks; the ledger that runs or replays each one
  coordinator.py   consistent cuts over every rank, mismatches stopped before any rank blocks
  numerics.py      across ranks: where a carried NaN/Inf was born; replicas that must stay identical
  session.py       the Coordinator behind the Session's interface, for the DAP adapter
  traces.py        traces of many ranks: the index of the ranks' traces, written and checked
"""
