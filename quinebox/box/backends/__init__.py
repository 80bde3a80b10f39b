"""Container engines that can run a policy's container configuration."""
