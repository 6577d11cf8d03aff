"""Wall time per data-parallel VOGN step against the number of MPI ranks (refbayes.methods.vogn_mpi).

    for R in 1 2 3; do OMP_NUM_THREADS=1 .venv/bin/mpiexec -n $R .venv/bin/python tools/mpi_vogn_timing.py [M]; done

An MLP [784, 100, 10] (D = 79,510) on synthetic inputs, M = 128 (or argv[1]) rows per step split over the
ranks, S = 1 draw, per-example squares ("ef"); rank 0 prints the median of 20 timed steps after 3
warm-up steps (each step timed from a barrier to the end of its update, with its local
estimates (vogn.5) and its Allreduce (vogn.6) timed apart; the step is vogn_mpi.step's).
"""
import sys

import numpy as np
from mpi4py import MPI

from refbayes.methods import vogn, vogn_mpi
from refbayes.methods._estimates import Batch
from refbayes.models import MLP

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
N, S = 2048, 1
M = int(sys.argv[1]) if len(sys.argv) > 1 else 128  # rows per step, all ranks together
rng = np.random.default_rng(0)
X = rng.standard_normal((N, 784))
y = rng.integers(0, 10, N)
model = MLP([784, 100, 10], activation="relu", likelihood="categorical")
state = vogn.init(0.05 * rng.standard_normal(model.D), np.ones(model.D))
cfg = vogn.VOGNConfig(N, delta=1.0, alpha=1e-3)
times = []
for k in range(23):
    idx = rng.permutation(N)[:M]
    eps = rng.standard_normal((model.D, S))
    mine = vogn_mpi.shard(idx, rank, size)
    comm.Barrier()
    t0 = MPI.Wtime()
    est = vogn.local_estimates(state, Batch(X[mine], y[mine]), eps, cfg, model)
    t1 = MPI.Wtime()
    total = vogn_mpi.reduce_estimates(est, comm)
    t2 = MPI.Wtime()
    state, _ = vogn.apply(state, total.g_hat, total.h_hat, cfg)
    if k >= 3:
        times.append((MPI.Wtime() - t0, t1 - t0, t2 - t1))
worst = np.empty(3)
comm.Reduce(np.median(np.array(times), axis=0), worst, op=MPI.MAX, root=0)
if rank == 0:
    print(f"ranks {size}: {1e3 * worst[0]:.1f} ms per step (local estimates "
          f"{1e3 * worst[1]:.1f} ms, Allreduce {1e3 * worst[2]:.1f} ms; medians of 20, slowest "
          f"rank), rows per rank {M // size}-{-(-M // size)}, D = {model.D}")
