"""An independent, naive parse of one LIBSVM text line, to check the library's reader against."""
import numpy as np


def first_line(path, p):
    """(label token as written, dense row (p,)) of the first line of ``path``; indices are 1-based."""
    with open(path) as fh:
        tokens = fh.readline().split()
    row = np.zeros(p)
    for tok in tokens[1:]:
        i, v = tok.split(":")
        row[int(i) - 1] = float(v)
    return tokens[0], row
