"""A stand-in for the real Horovod (which needs MPI or Gloo and its own launcher): what a real Horovod
started without horovodrun shows, a world of one process."""
