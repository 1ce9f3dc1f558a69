"""moe_unpermute: the registry's name for kernels/moe's token unpermute (kernels/moe/permute.py); the op
lives in kernels.moe, this package holds its OpSpec only."""
