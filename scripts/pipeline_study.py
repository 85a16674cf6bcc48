"""What each piece of the end-to-end pipeline buys, measured (GPU only): host images in, host
predictions out, for one model and kernel at several batch sizes.

    pageable   ordinary NumPy host buffers, one launch per step
    pinned     page-locked host buffers, one launch per step
    graph      pinned buffers and a CUDA graph of the forward pass
    overlap    pinned, graphs, the batch in 4 chunks whose input copies overlap compute

Every configuration's predictions are checked against the first one's.
Usage: python scripts/pipeline_study.py [--model alexnet] [--kernel K] [--batch 1,128,1024]
       [--out FILE.json]
"""

import argparse
import json

import numpy as np

from convlab.bench import lab
from convlab.models import get_model
from convlab.net.pipeline import OverlappedPipeline, Pipeline

CHUNKS = 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="alexnet")
    parser.add_argument("--kernel")
    parser.add_argument("--batch", default="1,128,1024")
    parser.add_argument("--out")
    args = parser.parse_args()
    spec = get_model(args.model)
    kernel = args.kernel or lab.default_kernel(spec)[0]
    rows = []
    for batch in lab.parse_batches(args.batch, spec):
        x = lab.load_input(spec, batch)
        network = lab.build_network(spec, kernel, batch)
        times, predictions = {}, None
        for name, pinned, graph in (("pageable", False, False), ("pinned", True, False),
                                    ("graph", True, True)):
            pipe = Pipeline(network, pinned=pinned, graph=graph)
            pipe.load(x)
            times[name] = float(np.median(pipe.time_run(10)))
            got = pipe.run()
            predictions = got if predictions is None else predictions
            assert np.array_equal(got, predictions), f"{name} changed the predictions"
        if batch % CHUNKS == 0 and batch >= 2 * CHUNKS:
            chunked = OverlappedPipeline(lab.build_network(spec, kernel, batch // CHUNKS), CHUNKS)
            chunked.load(x)
            times["overlap"] = float(np.median(chunked.time_run(10)))
            assert np.array_equal(chunked.run(), predictions), "overlap changed the predictions"
        rows.append({"batch": batch, "kernel": kernel, **times})
        print(f"batch {batch:5d}: " + "  ".join(f"{k} {v:8.3f} ms" for k, v in times.items()),
              flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "kernel": kernel, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
