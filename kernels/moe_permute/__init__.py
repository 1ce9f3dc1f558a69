"""moe_permute: the registry's name for kernels/moe's token permute (kernels/moe/permute.py); the op lives
in kernels.moe, this package holds its OpSpec only."""
