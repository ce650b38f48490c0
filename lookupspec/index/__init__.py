"""Token stores: suffix/n-gram structures and continuation statistics (numba)."""
