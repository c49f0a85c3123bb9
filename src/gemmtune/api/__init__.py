"""The user's entry points: `tuned_gemm` and its dispatch (`dispatch`), the torch op and
linear layers (`torch_ops`)."""
