"""`make bench`: pgbench workloads against skiplock, the seed 001 queue and the machine's ceiling.

Modules: run (the command), pgbench (running it), designs (skiplock and the seed baseline as the
harness sees them), points (fixed-length pgbench runs: ceilings, W1, W1b, W2, W2b), timeline
(W3 and W4: workers, a producer, samples over time), report (stdout, RESULTS.md, JSON), chart.
"""
