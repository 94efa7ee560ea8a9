"""A band-aid for tests/models/forensics/log_of_softmax.py: the softmax and its log in float64. It moves the
underflow from scores ~100 apart to ~750 apart, so it holds on the example and fails at 8 times its range."""

PATCHES = {"softmax": "float64", "log": "float64"}
