"""The float64 oracle: the NumPy forward pass, the per-element error bound every output is
checked against, and the diagnosis of a wrong output."""
