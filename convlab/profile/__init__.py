"""`convlab profile`: a CUPTI activity trace of a run and its nvprof-style tables."""
