"""The families of benchmarks/hostile.py: one module a family, each with its TITLE, BUDGET_S and run(family).

common.py holds what they share: the run's sandbox (Ctx), the servers and connections (Server, Wire, Pool), one
input's verdict (Check, Outcome) and a family's tally (Family, Tally), and what counts as a leak.
"""
