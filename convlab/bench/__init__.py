"""Runs and studies: one run (the lab), its records, compare, the tuner, saved results, the
timer's defences, and the jobs that run a kernel file in a child process."""
