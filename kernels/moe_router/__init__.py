"""moe_router: the registry's name for kernels/moe's router (kernels/moe/router.py); the op lives in
kernels.moe, this package holds its OpSpec only."""
