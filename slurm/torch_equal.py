"""Whether two PyTorch saves hold the same state: `python torch_equal.py A B`.

A and B are two files saved with torch.save, or two directories of them
(the same names in both). Every tensor must be torch.equal (same dtype,
same values, bit for bit), every other value ==, recursively through dicts,
lists and tuples. Exit 0 and "equal: N file(s)" when they are; exit 1 naming
the first difference otherwise. Used by tests/it/torch_exec.rs and the
exec-ddp drill (slurm/drill.sh).
"""

import os
import sys

import torch


def same(x, y, at):
    if isinstance(x, torch.Tensor):
        if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)):
            raise AssertionError("%s: the tensors differ" % at)
    elif isinstance(x, dict):
        if not isinstance(y, dict) or x.keys() != y.keys():
            raise AssertionError("%s: the keys differ" % at)
        for k in x:
            same(x[k], y[k], "%s/%s" % (at, k))
    elif isinstance(x, (list, tuple)):
        if not isinstance(y, (list, tuple)) or len(x) != len(y):
            raise AssertionError("%s: the lengths differ" % at)
        for i, (p, q) in enumerate(zip(x, y)):
            same(p, q, "%s[%d]" % (at, i))
    elif x != y:
        raise AssertionError("%s: %r != %r" % (at, x, y))


def main(a, b):
    for path in (a, b):
        if not os.path.exists(path):
            raise AssertionError("%s does not exist: nothing to compare (did the run that writes it fail?)" % path)
    if os.path.isdir(a) != os.path.isdir(b):
        raise AssertionError("%s and %s are not both directories (or both files)" % (a, b))
    if os.path.isdir(a):
        names = sorted(os.listdir(a))
        if not names:
            raise AssertionError("%s is empty: nothing to compare (did the run that writes it fail?)" % a)
        if names != sorted(os.listdir(b)):
            raise AssertionError("the files differ: %s vs %s" % (names, sorted(os.listdir(b))))
        pairs = [(os.path.join(a, n), os.path.join(b, n), n) for n in names]
    else:
        pairs = [(a, b, os.path.basename(a))]
    for x, y, name in pairs:
        same(torch.load(x), torch.load(y), name)
    print("equal: %d file(s)" % len(pairs))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: torch_equal.py A B")
    try:
        main(sys.argv[1], sys.argv[2])
    except (AssertionError, OSError) as e:
        sys.exit("differ: %s" % e)
