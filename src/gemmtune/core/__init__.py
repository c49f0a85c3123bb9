"""What every layer shares: the problem, the config, element types, the device, settings."""
