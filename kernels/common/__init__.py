"""Pieces shared by the op families: the OpSpec contract, dtypes and device facts."""
