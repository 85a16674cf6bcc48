"""The float64 oracle: the NumPy forward pass, the per-element error bound every output is
checked against (the LRN's, with the bound of the kernels that compute it, in lrn.py), and the
diagnosis of a wrong output."""
