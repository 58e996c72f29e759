"""Joining the job: the rendezvous, check-in, each member's control channel, and the membership it yields."""
