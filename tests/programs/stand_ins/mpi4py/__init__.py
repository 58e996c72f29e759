"""A stand-in for the real mpi4py (which needs an MPI library): what a real MPI started without mpirun
shows, a world of one process."""
