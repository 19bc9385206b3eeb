"""The tour (`make demo`): the lab's experiments run end to end, each lesson a check decided
from evidence (`evidence.py`), and the report written from the run."""
