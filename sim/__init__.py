"""The deterministic simulator's stand-ins for the services the fleet uses."""
