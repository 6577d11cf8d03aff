"""Run under mpiexec by tests/methods/test_vogn_mpi.py: data-parallel VOGN on the test problem;
rank 0 writes the final state to the npz named by argv[1] (argv[2]: S, argv[3]: M)."""
import sys

import numpy as np

from refbayes.methods import vogn_mpi
from tests.methods.test_vogn_mpi import EPOCHS, SEED, problem

if __name__ == "__main__":
    from mpi4py import MPI
    out, S, M = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    model, X, y, state, cfg = problem()
    final = vogn_mpi.run(state, cfg, model, X, y, rng=np.random.default_rng(SEED),
                         epochs=EPOCHS, M=M, S=S)
    states = MPI.COMM_WORLD.gather(final, root=0)
    if MPI.COMM_WORLD.Get_rank() == 0:
        same = all(np.array_equal(s.mu, final.mu) and np.array_equal(s.s, final.s)
                   for s in states)  # every rank applied the same update
        np.savez(out, mu=final.mu, s=final.s, m=final.m, t=final.t, same=same,
                 size=MPI.COMM_WORLD.Get_size())
