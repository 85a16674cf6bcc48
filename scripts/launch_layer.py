"""Launch one variant on one layer a few times on random data: a small workload for `ncu`.

`convlab profile --ncu` gives the ncu command for a layer inside a model's forward pass; this
script is for a layer of any shape, or one tiling of a tunable variant, without the rest of a
`convlab run` (float64 references, timing loops) around it. It prints the variant's kernel
names and, for a tunable variant, the tiling the shape got.

Usage: ncu --set full -k regex:conv_forward -s 1 -c 1 \\
           python scripts/launch_layer.py --kernel pipelined --layer 128,256,13,13,384,3,1,1 --bias
       [--config '{"bm": 128, ...}'] [--epilogue relu] [--launches 3]
"""

import argparse
import json

import numpy as np

from convlab.kernels import get_variant
from convlab.oracle.verify import random_problem
from convlab.shapes import parse_layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--layer", required=True, help="B,C,H,W,M,K[,stride,pad,groups]")
    parser.add_argument("--bias", action="store_true")
    parser.add_argument("--epilogue", default="relu", choices=("relu", "none"))
    parser.add_argument("--config", help="a tiling as JSON (one of the variant's configs())")
    parser.add_argument("--launches", type=int, default=3,
                        help="0: compile and report the tiling only")
    args = parser.parse_args()

    import cupy

    shape = parse_layer(args.layer, bias=args.bias)
    variant = get_variant(args.kernel)
    if args.config:
        variant = variant.configured(json.loads(args.config))
    epilogue = None if args.epilogue == "none" else args.epilogue
    tiling = variant.config_for if variant.config_type is not None else None
    x, w, b = random_problem(shape, np.random.default_rng(0))
    op = variant.prepare(shape, w, epilogue, b if shape.bias else None)
    xs = op.stage(cupy.asarray(x))
    y = cupy.empty(op.output_shape, dtype=cupy.float32)
    for _ in range(args.launches):
        op(xs, y)
    cupy.cuda.Device().synchronize()
    print(f"{variant.name} on {shape.describe()}: {args.launches} launches"
          + (f"; tiling {tiling(shape, epilogue).as_dict()}" if tiling else ""))


if __name__ == "__main__":
    main()
