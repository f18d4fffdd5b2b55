"""Correctness matrix, benchmarks and plots built on the public API, and the lab's window on the internals.

  check    `vflash check`: the correctness matrix against the fp32 / fp64 oracle
  cases    correctness cases: one shape and option set, its inputs and its verdicts
  oracle   the correctness rule: within twice the same-dtype explicit path's error from the fp64 reference
  bench    `vflash bench`: latency, TFLOP/s and peak memory of vflash and the engines people would otherwise use
  serving  `vflash bench --sweep decode | varlen | chunked | merge | write`: the serving path against those engines
  timing   how the harness and the lab time work: one implementation of each timing protocol
  memory   incremental peak memory of one call, on CUDA or on the CPU
  memlab   `vflash memory`: peak memory of materialised attention against vflash and SDPA, growing S
  plot     `vflash plot`: PNGs from a `vflash bench` or `vflash memory` CSV
  env      the environment record kept with every check log and benchmark CSV
  lab      the internals the lab scripts (benchmarks/) tune, time and compile, each under one name
"""
