"""moe_mlp: the registry's name for kernels/moe's layer experts (kernels/moe/experts.py, moe_experts); the
op lives in kernels.moe, this package holds its OpSpec only."""
