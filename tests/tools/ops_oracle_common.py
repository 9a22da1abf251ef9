"""tests/tools/ops_oracle_common.py -- what gpt2_ops_oracle.py and llama_ops_oracle.py
share: gen and compare over an oracle's cases, the error measure and the bounds.

An oracle is an Oracle: its cases (name, op, shapes), the inputs of each and torch's
results on them; Oracle.main(argv, __doc__) runs its command line:

    <oracle>.py gen DIR
    <oracle>.py compare DIR OUTDIR [CASE...]

gen writes, with the oracle's fixed seed, the inputs of each case as raw
little-endian files DIR/in/<case>.<tensor> (float32, or the other dtypes the
oracle allows), and DIR/in/cases.txt, one line per case: "<case> <op> key=value..."
(the checker takes its shapes and constants from there). For every output and
gradient it stores torch's result in DIR/ref/<case>.<tensor>.npy (float64) and
DIR/ref32/ (float32).

compare prints one TAP line per case and tensor and exits 1 if any is over its
bound (2 for a CASE that is not one). Error of a tensor: max over elements of
|ours - ref| / max(|ref|, floor), with floor = FLOOR * max|ref| over the tensor
(or the oracle's own fraction for that tensor), so that elements that cancel to
near zero are judged at the tensor's scale instead of their own. A NaN or inf
anywhere fails. Bounds: FWD_BOUND for forward outputs, GRAD_BOUND for gradients
(tensors named d...). Each gradient is also compared as "<case>.<grad>+=", the
checker's backward run into a buffer prefilled with prefill(n), against prefill
+ the gradient; the oracle's scratch tensors, which a backward overwrites, have
no such line.
torch's own float32 error against float64 is printed next to ours for scale.
"""
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

FWD_BOUND = 1e-5
GRAD_BOUND = 1e-4
FLOOR = 1e-3


def prefill(n):
    """What the checkers put in a gradient buffer before an accumulating
    backward: 0.5 + 0.125 (i mod 7), exact in float32."""
    return (0.5 + 0.125 * (np.arange(n) % 7)).astype(np.float32)


# forward outputs get FWD_BOUND, gradients (d...) GRAD_BOUND
def bound(tensor):
    return GRAD_BOUND if tensor.startswith("d") else FWD_BOUND


def rel_err(ours, ref, floor_frac=FLOOR):
    """max |ours - ref| / max(|ref|, floor_frac max|ref|); inf if ours has a NaN/inf."""
    ours = ours.astype(np.float64).ravel()
    ref = ref.astype(np.float64).ravel()
    if not np.all(np.isfinite(ours)):
        return math.inf
    scale = np.max(np.abs(ref)) if ref.size else 0.0
    floor = max(floor_frac * scale, 1e-30)
    return float(np.max(np.abs(ours - ref) / np.maximum(np.abs(ref), floor)))


def load_out(path, n):
    if not os.path.exists(path):
        return None, f"{path} is missing"
    a = np.fromfile(path, dtype="<f4")
    if a.size != n:
        return None, f"{path} has {a.size} float32, expected {n}"
    return a, None


@dataclass
class Oracle:
    prog: str  # first in its messages
    seed: int
    cases: Callable  # () -> [(name, op, shapes dict)]
    gen_inputs: Callable  # (name, op, shapes, rng) -> {tensor: numpy array}
    reference: Callable  # (op, shapes, inputs, torch dtype) -> {tensor: numpy array of dtype}
    in_dtypes: tuple = (np.float32,)  # what an input may be
    fwd_only: dict = field(default_factory=dict)  # case -> the tensors stored (not its gradients)
    floors: dict = field(default_factory=dict)  # tensor -> its floor fraction, instead of FLOOR
    scratch: tuple = ()  # gradients a backward overwrites: no "+=" line

    def gen(self, d):
        import torch

        torch.use_deterministic_algorithms(True)
        rng = np.random.default_rng(self.seed)
        for sub in ("in", "ref", "ref32"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        lines = []
        for name, op, s in self.cases():
            x = self.gen_inputs(name, op, s, rng)
            for k, v in x.items():
                assert v.dtype in self.in_dtypes, (name, k, v.dtype)
                v.astype(v.dtype.newbyteorder("<")).tofile(os.path.join(d, "in", f"{name}.{k}"))
            for sub, dtype in (("ref", torch.float64), ("ref32", torch.float32)):
                for k, v in self.reference(op, s, x, dtype).items():
                    if name in self.fwd_only and k not in self.fwd_only[name]:
                        continue
                    np.save(os.path.join(d, sub, f"{name}.{k}.npy"), v)
            lines.append(" ".join([name, op] + [f"{k}={v!r}" for k, v in s.items()]))
        with open(os.path.join(d, "in", "cases.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def compare(self, d, outdir, only):
        n = 0
        failed = 0

        def report(ok, text):
            nonlocal n, failed
            n += 1
            failed += 0 if ok else 1
            print(f"{'ok' if ok else 'not ok'} {n} - {text}")

        known = [c[0] for c in self.cases()]
        for c in only:
            if c not in known:
                print(f"{self.prog}: unknown case {c} (cases: {' '.join(known)})", file=sys.stderr)
                return 2
        for name, op, s in self.cases():
            if only and name not in only:
                continue
            refs = sorted(f[len(name) + 1:-4] for f in os.listdir(os.path.join(d, "ref"))
                          if f.startswith(name + ".") and f.endswith(".npy"))
            for tensor in refs:
                ref = np.load(os.path.join(d, "ref", f"{name}.{tensor}.npy"))
                ref32 = np.load(os.path.join(d, "ref32", f"{name}.{tensor}.npy"))
                b = bound(tensor)
                fl = self.floors.get(tensor, FLOOR)
                kinds = [("", ref)]
                # accumulated into prefilled buffers
                if tensor.startswith("d") and tensor not in self.scratch:
                    kinds.append(("+=", ref + prefill(ref.size).reshape(ref.shape)))
                for suffix, want in kinds:
                    label = f"{name}.{tensor}{suffix}"
                    ours, why = load_out(os.path.join(outdir, label), want.size)
                    if ours is None:
                        report(False, f"{label}: {why}")
                        continue
                    e = rel_err(ours, want, fl)
                    ctx = f" (torch fp32: {rel_err(ref32, ref, fl):.1e})" if not suffix else ""
                    report(e <= b, f"{label}: max rel err {e:.1e} <= {b:.0e}{ctx}")
        print(f"1..{n}")
        return 1 if failed else 0

    def main(self, argv, doc):
        """The command line (argv without the program); doc's second paragraph is
        the usage."""
        if len(argv) >= 2 and argv[0] == "gen":
            self.gen(argv[1])
            return 0
        if len(argv) >= 3 and argv[0] == "compare":
            return self.compare(argv[1], argv[2], argv[3:])
        print(doc.split("\n\n")[1], file=sys.stderr)
        return 2
