"""convlab: a JIT kernel lab for the forward pass of a CNN's convolution layer.

The package in layers, top first (a module imports only from its own layer or below):

    cli                 click commands; no logic of its own
    report              renderings of records
    profile/            CUPTI trace of a run and its tables
    bench/              one run (lab), its records, compare, tune, saved results, timer defences
    userkernel/         kernel files of your own: load, check, sanitize, scaffold
    net/                the planned forward pass, pipelines, datasets, training, weight import
    kernels/, ops/      conv variants; the other layers' kernels
    tuning, oracle/     the tuned-config cache; the float64 reference and error bounds
    models, gpu/        model specs and weights; the device (probe, NVRTC, timer, peaks,
                        roofline, isolation)
    shapes, tables, plot, errors
"""

__version__ = "0.1.0"
